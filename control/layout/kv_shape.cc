#include "control/layout/kv_shape.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

namespace kvrail::layout {
namespace {

constexpr char kGroup[] = "full_attention";

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
  const int64_t page_bytes = FieldPageBytes(shape, tp_size);
  const int suffixes = shape.latent ? 1 : 2;
  const int64_t fields = int64_t{shape.layers} * suffixes;
  // (pages + 1) * page_bytes * fields must stay below 2^52 (kMaxContractInteger).
  if (page_bytes > kMaxContractInteger / (shape.pages + 1) / fields) {
    return MakeError(ErrorCategory::kInvalidContract,
                     absl::StrFormat("kv shape: %d fields of %d pages of %d bytes pass the "
                                     "contract's 2^52 integer limit",
                                     fields, shape.pages + 1, page_bytes));
  }
  Contract contract;
  CachePlan& plan = contract.plan;
  plan.prefix_granularity = shape.prefix_granularity;
  plan.num_lcm_blocks = shape.pages;
  plan.lcm_block_bytes = page_bytes * fields;
  plan.groups.push_back({kGroup, 1, shape.pages + 1});
  // Planes back to back in plane_id order (§4.6): ids sort as zero-padded layer numbers.
  std::vector<std::string> plane_ids;
  int64_t offset = 0;
  for (int layer = 0; layer < shape.layers; ++layer) {
    for (int s = 0; s < suffixes; ++s) {
      const char* suffix = shape.latent ? "latent" : (s == 0 ? "k" : "v");
      const std::string plane_id = absl::StrFormat("unit.%05d.%s", layer, suffix);
      const std::string field_id = absl::StrFormat("layer.%d.%s", layer, suffix);
      plan.planes.push_back({plane_id, page_bytes, offset});
      offset += page_bytes * (shape.pages + 1);
      FieldLayout field;
      field.group_id = kGroup;
      field.field_id = field_id;
      field.plane_id = plane_id;
      field.shape = shape.latent ? std::vector<int64_t>{shape.page_tokens, shape.latent_dim}
                                 : std::vector<int64_t>{shape.page_tokens, shape.kv_heads / tp_size,
                                                        shape.head_dim};
      field.dtype = shape.dtype;
      field.field_offset_bytes = 0;
      field.page_stride_bytes = page_bytes;
      plan.fields.push_back(field);
      if (!shape.latent) {
        contract.transfer_schema.push_back({field_id, Partition{1, shape.kv_heads, {}}});
      }
    }
  }
  GroupSpec spec;
  spec.group_id = kGroup;
  spec.retention = Retention::kFullHistory;
  spec.rows_per_page = shape.page_tokens;
  spec.entry_stride_tokens = 1;
  spec.family = "history";
  spec.transfer_policy = TransferPolicy::kFullSuffix;
  contract.group_specs.push_back(spec);
  KVRAIL_RETURN_IF_ERROR(ValidateContract(contract));
  KVRAIL_RETURN_IF_ERROR(CheckArenaFits(contract));
  return contract;
}

}  // namespace kvrail::layout
