#include "control/layout/kv_shape.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

namespace kvrail::layout {
namespace {

constexpr char kGroup[] = "full_attention";
constexpr char kSlidingGroup[] = "sliding_window";
constexpr char kStateGroup[] = "state";

}  // namespace

int64_t FieldPageBytes(const KvShape& shape, int tp_size) {
  const int64_t per_token = shape.latent
                                ? int64_t{shape.latent_dim}
                                : int64_t{shape.kv_heads / std::max(1, tp_size)} * shape.head_dim;
  return int64_t{shape.page_tokens} * per_token * DTypeSize(shape.dtype);
}

absl::StatusOr<Contract> BuildKvContract(const KvShape& shape, int tp_size) {
  auto positive = [](const char* member, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return MakeError(ErrorCategory::kInvalidContract,
                     absl::StrFormat("kv shape: %s is %d; it must be > 0", member, value));
  };
  KVRAIL_RETURN_IF_ERROR(positive("layers", shape.layers));
  KVRAIL_RETURN_IF_ERROR(positive("page_tokens", shape.page_tokens));
  KVRAIL_RETURN_IF_ERROR(positive("pages", shape.pages));
  KVRAIL_RETURN_IF_ERROR(positive("prefix_granularity", shape.prefix_granularity));
  KVRAIL_RETURN_IF_ERROR(positive("tp_size", tp_size));
  if (shape.latent) {
    KVRAIL_RETURN_IF_ERROR(positive("latent_dim", shape.latent_dim));
  } else {
    KVRAIL_RETURN_IF_ERROR(positive("kv_heads", shape.kv_heads));
    KVRAIL_RETURN_IF_ERROR(positive("head_dim", shape.head_dim));
    if (shape.kv_heads % tp_size != 0) {
      return MakeError(ErrorCategory::kInvalidContract,
                       absl::StrFormat("kv shape: kv_heads %d is not a multiple of tp_size %d",
                                       shape.kv_heads, tp_size));
    }
  }
  if (shape.latent && (shape.sliding_window_tokens > 0 || shape.state_dim > 0)) {
    return MakeError(ErrorCategory::kInvalidContract,
                     "kv shape: sliding_window_tokens and state_dim do not apply to a latent");
  }
  if (shape.sliding_window_tokens < 0 || shape.state_dim < 0) {
    return MakeError(ErrorCategory::kInvalidContract,
                     "kv shape: sliding_window_tokens and state_dim must be >= 0");
  }
  // Every field, layer by layer (planes sort as zero-padded layer numbers, §4.6).
  struct Field {
    const char* group;
    std::string suffix;
    std::vector<int64_t> dims;
    int64_t page_bytes;
    std::optional<Partition> partition;
  };
  const char* attention = shape.sliding_window_tokens > 0 ? kSlidingGroup : kGroup;
  const int64_t heads = shape.latent ? 1 : shape.kv_heads / tp_size;
  std::vector<std::pair<int, Field>> fields;
  for (int layer = 0; layer < shape.layers; ++layer) {
    if (shape.latent) {
      fields.push_back({layer,
                        {kGroup,
                         "latent",
                         {shape.page_tokens, shape.latent_dim},
                         FieldPageBytes(shape, tp_size),
                         std::nullopt}});
    } else if (shape.state_dim > 0 && layer % 2 == 1) {
      fields.push_back({layer,
                        {kStateGroup,
                         "state",
                         {heads, shape.state_dim, shape.head_dim},
                         heads * shape.state_dim * shape.head_dim * DTypeSize(shape.dtype),
                         Partition{0, shape.kv_heads, {}}}});
    } else {
      for (const char* suffix : {"k", "v"}) {
        fields.push_back({layer,
                          {attention,
                           suffix,
                           {shape.page_tokens, heads, shape.head_dim},
                           FieldPageBytes(shape, tp_size),
                           Partition{1, shape.kv_heads, {}}}});
      }
    }
  }
  // (pages + 1) * lcm_block_bytes must stay below 2^52 (kMaxContractInteger).
  int64_t lcm_block_bytes = 0;
  for (const auto& [layer, f] : fields) {
    if (f.page_bytes > kMaxContractInteger / (shape.pages + 1) - lcm_block_bytes) {
      return MakeError(ErrorCategory::kInvalidContract,
                       absl::StrFormat("kv shape: %d fields of %d pages pass the contract's 2^52 "
                                       "integer limit",
                                       fields.size(), shape.pages + 1));
    }
    lcm_block_bytes += f.page_bytes;
  }
  Contract contract;
  CachePlan& plan = contract.plan;
  plan.prefix_granularity = shape.prefix_granularity;
  plan.num_lcm_blocks = shape.pages;
  plan.lcm_block_bytes = lcm_block_bytes;
  int64_t offset = 0;
  std::vector<std::string> groups;
  for (const auto& [layer, f] : fields) {
    const std::string plane_id = absl::StrFormat("unit.%05d.%s", layer, f.suffix);
    const std::string field_id = absl::StrFormat("layer.%d.%s", layer, f.suffix);
    plan.planes.push_back({plane_id, f.page_bytes, offset});
    offset += f.page_bytes * (shape.pages + 1);
    FieldLayout field;
    field.group_id = f.group;
    field.field_id = field_id;
    field.plane_id = plane_id;
    field.shape = f.dims;
    field.dtype = shape.dtype;
    field.field_offset_bytes = 0;
    field.page_stride_bytes = f.page_bytes;
    plan.fields.push_back(field);
    if (f.partition.has_value()) contract.transfer_schema.push_back({field_id, *f.partition});
    if (std::find(groups.begin(), groups.end(), f.group) == groups.end()) groups.push_back(f.group);
  }
  for (const char* group : {kGroup, kSlidingGroup, kStateGroup}) {
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) continue;
    plan.groups.push_back({group, 1, shape.pages + 1});
    GroupSpec spec;
    spec.group_id = group;
    if (absl::string_view(group) == kStateGroup) {
      spec.family = "state";
      spec.transfer_policy = TransferPolicy::kLatestSnapshot;
      spec.checkpoint_granularity = shape.page_tokens;
    } else {
      spec.rows_per_page = shape.page_tokens;
      spec.entry_stride_tokens = 1;
      spec.family = "history";
      spec.transfer_policy = TransferPolicy::kFullSuffix;
      if (absl::string_view(group) == kSlidingGroup) {
        spec.retention = Retention::kSlidingWindow;
        spec.sliding_window_tokens = shape.sliding_window_tokens;
      }
    }
    contract.group_specs.push_back(spec);
  }
  KVRAIL_RETURN_IF_ERROR(ValidateContract(contract));
  KVRAIL_RETURN_IF_ERROR(CheckArenaFits(contract));
  return contract;
}

}  // namespace kvrail::layout
