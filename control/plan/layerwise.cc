#include "control/plan/layerwise.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "control/layout/manifest.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

absl::Status SelectionError(absl::string_view problem) {
  return MakeError(ErrorCategory::kInvalidManifest,
                   absl::StrCat("layerwise selection ", problem, " (CACHEPD §6.11)"));
}

int64_t FloorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

}  // namespace

absl::StatusOr<std::vector<GroupSelection>> SelectChunkBlocks(
    const layout::Contract& contract, absl::Span<const std::vector<int64_t>> block_tables,
    int64_t prefix_len, int64_t prompt_len, int64_t chunk_start, int64_t chunk_end) {
  if (block_tables.size() != contract.group_specs.size()) {
    return SelectionError(absl::StrCat("needs one block table per group (",
                                       contract.group_specs.size(), "), got ",
                                       block_tables.size()));
  }
  if (chunk_start < 0 || chunk_start >= chunk_end) {
    return SelectionError("requires chunk_start < chunk_end");
  }
  if (chunk_end > prompt_len) return SelectionError("requires chunk_end <= prompt_len");
  if (prefix_len < 0 || prefix_len >= prompt_len || prompt_len > layout::kMaxTokens) {
    return SelectionError("requires 0 <= prefix_len < prompt_len");
  }
  const bool final_chunk = chunk_end == prompt_len;
  std::vector<GroupSelection> out;
  for (size_t i = 0; i < contract.group_specs.size(); ++i) {
    const layout::GroupSpec& spec = contract.group_specs[i];
    const layout::SlotRange slots = layout::LogicalSlots(spec, prefix_len, prompt_len);
    const int64_t n = slots.size();
    const int64_t g = spec.block_granularity();
    int64_t begin = 0, end = 0;
    if (spec.transfer_policy == layout::TransferPolicy::kFullSuffix) {
      const int64_t ready_end = final_chunk ? -FloorDiv(-chunk_end, g) : FloorDiv(chunk_end, g);
      begin = std::clamp<int64_t>(FloorDiv(chunk_start, g) - slots.begin, 0, n);
      end = std::clamp<int64_t>(ready_end - slots.begin, 0, n);
    } else if (final_chunk) {
      begin = 0;
      end = std::min<int64_t>(1, n);
    }
    GroupSelection selection{spec.group_id, {}, {}};
    for (int64_t position = begin; position < end; ++position) {
      const int64_t slot = slots.begin + position;
      if (slot < 0 || slot >= static_cast<int64_t>(block_tables[i].size())) {
        return SelectionError(absl::StrCat("group '", spec.group_id, "' needs slot ", slot,
                                           " beyond its block table"));
      }
      selection.source_block_ids.push_back(block_tables[i][slot]);
      selection.destination_positions.push_back(position);
    }
    out.push_back(std::move(selection));
  }
  return out;
}

absl::StatusOr<int64_t> FieldLayer(absl::string_view field_id) {
  std::vector<absl::string_view> parts = absl::StrSplit(field_id, absl::MaxSplits('.', 2));
  int64_t layer = -1;
  if (parts.size() != 3 || parts[0] != "layer" || parts[2].empty() ||
      !absl::SimpleAtoi(parts[1], &layer) || layer < 0 ||
      parts[1].find_first_not_of("0123456789") != absl::string_view::npos) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     absl::StrCat("producer schedule: field id '", field_id,
                                  "' is not of the form layer.<N>.<suffix> (CACHEPD §6.11)"));
  }
  return layer;
}

absl::StatusOr<std::vector<std::vector<std::string>>> FieldsByProducerStep(
    absl::Span<const std::string> field_ids, int num_target_layers) {
  if (num_target_layers < 0) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     "producer schedule: num_target_layers must be >= 0 (CACHEPD §6.11)");
  }
  std::vector<std::vector<std::string>> steps(num_target_layers);
  std::vector<std::string> draft;
  for (const std::string& id : field_ids) {
    KVRAIL_ASSIGN_OR_RETURN(const int64_t layer, FieldLayer(id));
    if (layer < num_target_layers) {
      steps[layer].push_back(id);
    } else {
      draft.push_back(id);
    }
  }
  if (!draft.empty()) steps.push_back(std::move(draft));
  return steps;
}

bool IsStepReady(uint64_t ready, uint64_t target) {
  constexpr uint64_t kModulus = uint64_t{1} << 62;
  constexpr uint64_t kHalf = uint64_t{1} << 61;
  ready %= kModulus;
  target %= kModulus;
  return target != ready && ((target + kModulus - ready) % kModulus) > kHalf;
}

}  // namespace kvrail::plan
