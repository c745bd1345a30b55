// Layerwise mode (CACHEPD §6.11): the prefill copies while its forward pass runs, one chunk of
// the prompt and one round of producer steps (layers) at a time. Prefill-local; the wire and
// the decode are unchanged.
#ifndef KVRAIL_CONTROL_PLAN_LAYERWISE_H_
#define KVRAIL_CONTROL_PLAN_LAYERWISE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"

namespace kvrail::plan {

// One group's share of a chunk: the prefill's block ids to send, and for each, its position in
// the decode manifest's block list of that group.
struct GroupSelection {
  std::string group_id;
  std::vector<int64_t> source_block_ids;
  std::vector<int64_t> destination_positions;
};

// build_cache_layerwise_block_selection (§6.11): for the prefill chunk [chunk_start,
// chunk_end) of a request whose block table for group i (group_specs order) is
// block_tables[i], the blocks that are complete and not sent before. full_suffix groups take
// positions clamp(chunk_start // g - first_slot, 0, n) .. clamp(ready_end - first_slot, 0, n),
// with ready_end = ceil(chunk_end / g) on the final chunk (chunk_end == prompt_len) and
// floor(chunk_end / g) before it; latest_snapshot groups take position 0 on the final chunk
// only. The caller lowers the first chunk's start to prefix_len. Requires 0 <= chunk_start <
// chunk_end <= prompt_len; errors are invalid-manifest.
absl::StatusOr<std::vector<GroupSelection>> SelectChunkBlocks(
    const layout::Contract& contract, absl::Span<const std::vector<int64_t>> block_tables,
    int64_t prefix_len, int64_t prompt_len, int64_t chunk_start, int64_t chunk_end);

// The N of a field id "layer.<N>.<suffix>" (§6.11: N a decimal without sign, suffix
// non-empty), or an unsupported-layout error naming the field.
absl::StatusOr<int64_t> FieldLayer(absl::string_view field_id);

// build_cache_fields_by_producer_step (§6.11): step i < num_target_layers holds the fields
// "layer.i.*"; fields of draft layers (N >= num_target_layers) form one extra final step.
// Fields keep their input order within a step. A field id not of the form "layer.<N>.<...>"
// is an unsupported-layout error.
absl::StatusOr<std::vector<std::vector<std::string>>> FieldsByProducerStep(
    absl::Span<const std::string> field_ids, int num_target_layers);

// StepCounter.is_step_ready: the GPU-published counter `ready` has passed `target`, compared
// modulo 2^62 and wrap-safe: target != ready and (target + 2^62 - ready) mod 2^62 > 2^61.
bool IsStepReady(uint64_t ready, uint64_t target);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_LAYERWISE_H_
