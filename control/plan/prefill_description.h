// The prefill node's description a decode reads from the bootstrap server (`GET /route` with
// engine_rank=-1 and target_dp_group=-1, CACHEPD §2.2, §2.3) and the extensions of §10.2:
//
//   {"prefill_tp_size": <world>, "prefill_dp_size": <dp>, "cache_layout": "<contract wire>",
//    "prefill_pp_size": <pp>,                      // optional, default 1 (§10.2)
//    "cache_fields_by_stage": [["layer.0.k", ...], ...],  // optional, default one stage
//    "cache_sharded_groups": [{"group_id": "...", "owners": N}, ...]}  // kvrail, optional
//
// A Python prefill sends only the first three members; this parser then yields one stage
// holding every field and no sharded group, so the route is exactly §6.
#ifndef KVRAIL_CONTROL_PLAN_PREFILL_DESCRIPTION_H_
#define KVRAIL_CONTROL_PLAN_PREFILL_DESCRIPTION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/plan/owner_filter.h"
#include "control/plan/pipeline.h"

namespace kvrail::plan {

struct PrefillDescription {
  int world_size = 1;  // prefill_tp_size as the bootstrap reports it: tp * dp (* pp)
  int dp_size = 1;
  int pp_size = 1;
  int stage_tp_size = 1;      // P of one DP group of one stage: world / (dp * pp)
  layout::Contract contract;  // the wire contract every prefill rank registered (§2.1)
  PipelineLayout pipeline;    // fields_by_stage; one stage with every field by default
  std::vector<ShardedGroup> sharded_groups;
};

// Parses the JSON body of the sync response. Sizes may be JSON integers or strings holding an
// integer (surrounding whitespace trimmed), and must be positive (§10.5). A missing or null
// cache_layout means a prefill without paged-cache transfer (§2.3, §10.5). Errors are
// unsupported-layout, or the contract's invalid-contract, and name the member.
absl::StatusOr<PrefillDescription> ParsePrefillDescription(absl::string_view body);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_PREFILL_DESCRIPTION_H_
