// The prefill node's description a decode reads from the bootstrap server (`GET /route` with
// engine_rank=-1 and target_dp_group=-1): the sync answer of either revision.
//
//   {"prefill_tp_size": <world>, "prefill_dp_size": <dp>,
//    "prefill_pp_size": <pp>,             // 2026-09 (§12.4); optional, default 1 (§12.5)
//    "cache_layout": "<contract wire>",   // either form (§4.1, §12.1)
//    "cache_fields_by_stage": [["layer.0.k", ...], ...],  // 2026-09; missing or null: one
//                                                         // stage holding every field (§12.5)
//   }
//
// Other members are ignored, as the reference decode ignores them (among them an older kvrail
// server's own sharding declaration: the contract's shard_count declares sharding now, §12.8).
// A snapshot server sends only prefill_tp_size, prefill_dp_size and cache_layout (§2.2); this
// parser then yields one stage holding every field, so the route is exactly §6. Where the newer
// reference decode fails such a room (§12.5), kvrail follows the SHOULD of §12.5 and reads it.
#ifndef KVRAIL_CONTROL_PLAN_PREFILL_DESCRIPTION_H_
#define KVRAIL_CONTROL_PLAN_PREFILL_DESCRIPTION_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/layout/revision.h"
#include "control/plan/pipeline.h"

namespace kvrail::plan {

struct PrefillDescription {
  int world_size = 1;  // prefill_tp_size as the bootstrap reports it: tp * dp (* pp)
  int dp_size = 1;
  int pp_size = 1;
  int stage_tp_size = 1;      // P of one DP group of one stage: world / (dp * pp)
  layout::Contract contract;  // the wire contract every prefill rank registered (§2.1)
  PipelineLayout pipeline;    // fields_by_stage; one stage with every field by default
  // The form cache_layout was in (contract.revision): the revision the node's prefills speak,
  // and so the form a decode registers with them in (§12.11).
  layout::Revision revision = layout::kNewestRevision;
};

// Parses the JSON body of the sync response. Sizes may be JSON integers or strings holding an
// integer (surrounding whitespace trimmed), and must be positive (§10.5). A missing or null
// cache_layout means a prefill without paged-cache transfer (§2.3, §10.5). A missing or null
// cache_fields_by_stage means one stage holding every field, which needs prefill_pp_size 1.
// kvrail is stricter than the newer reference decode in two places (§12.5), since either would
// plan ranks the node does not have: the stage TP size prefill_tp_size / (prefill_dp_size *
// prefill_pp_size) must divide exactly (the reference floors), and the number of stages must
// equal prefill_pp_size (the reference does not compare them). Errors are unsupported-layout,
// or the contract's invalid-contract, and name the member.
absl::StatusOr<PrefillDescription> ParsePrefillDescription(absl::string_view body);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_PREFILL_DESCRIPTION_H_
