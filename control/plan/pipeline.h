// Prefill pipeline stages (CACHEPD §12.6; first seen in the Rust port, §10.1, §10.2): routes
// when the prefill model is split over pipeline-parallel stages, each holding the cache fields
// of its own layers. This is the reference's `build_pipeline_transfer_plan`:
//
//   * Stages and ranks. The prefill node has pp_size stages; one DP group of one stage has
//     stage_tp_size attention-TP ranks, where stage_tp_size = prefill_tp_size /
//     (prefill_dp_size * prefill_pp_size) and prefill_tp_size is the world the bootstrap
//     reports (§12.5, StageTpSize). Prefill rank (stage s, TP rank p) is known to the decode as
//     s * stage_tp_size + p (stage-major, GlobalPrefillRank): its engine_rank, the member of
//     E_d, Z_d and T_d, and the rank in its status frames.
//   * Contracts. Every stage publishes the same wire contract, that of the whole model, and
//     every plan runs over the wire contracts. fields_by_stage[s] lists the field ids stage s
//     holds; every field of the wire contract is in exactly one stage, and no other id may
//     appear (ValidatePipelineLayout; the reference's validate_cache_stage_fields, §12.3
//     step 4).
//   * One planner per stage. Stage s is planned alone: Planner::Create(stage_tp_size, D, wire,
//     decode, filter of stage s). A prefill rank of stage s builds exactly that planner
//     (CreateStagePlanner), decides registrations with it (OnRegistration) and sends only the
//     fields of its stage; its S_p, pre-allocation count and dummy status are its stage's.
//   * A decode rank's route spans the stages (PlanPipelineRoute): stage s contributes sources
//     (s, p) for every p of its stage route, with the same fragments and owner filters, in
//     stage-major order. Across stages:
//       E_d = { global(s, p) : p a source of stage s's route for d },
//       Z_d = { global(s, p) : S_p of stage s is empty } when d == 0, else empty,
//       T_d = the sorted union of E_d and Z_d; the decode needs |E_d| completions.
//   * Equal TP. The whole-field copy of §6.6 is used only when stage_tp_size == D, the stage
//     holds every field, and no group is sharded (§12.8); otherwise a stage routes its fields
//     with the explicit fragments of §6.3. A stage filter equal to the whole field set counts
//     as no filter, so one stage holding every field (SingleStage, the default when a
//     bootstrap sends no stage list) is exactly §6.
//   * A stage that holds no field has no route: PlanPipelineRoute fails with that stage's
//     "has no source fragments" for every decode rank, as the reference does.
#ifndef KVRAIL_CONTROL_PLAN_PIPELINE_H_
#define KVRAIL_CONTROL_PLAN_PIPELINE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/layout/contract.h"
#include "control/plan/fragment.h"
#include "control/plan/planner.h"
#include "control/plan/route.h"
#include "control/plan/stage_filter.h"

namespace kvrail::plan {

// Where a prefill node's cache fields live (the bootstrap members prefill_pp_size and
// cache_fields_by_stage, §12.3, §12.4).
struct PipelineLayout {
  int pp_size = 1;
  std::vector<std::vector<std::string>> fields_by_stage;  // one list per stage

  // One stage holding every field of `wire`, in plan order: the layout of a peer that sends
  // no stage list (§10.2).
  static PipelineLayout SingleStage(const layout::Contract& wire);

  // The filter of stage `stage`. Requires 0 <= stage < fields_by_stage.size().
  StageFilter FilterFor(int stage) const;
};

// Checks `layout` against the wire contract: 1 <= pp_size <= kMaxTpSize, one field list per
// stage, every id a field of `wire`, every field of `wire` in exactly one stage. Errors are
// unsupported-layout and name the stage and field.
absl::Status ValidatePipelineLayout(const PipelineLayout& layout, const layout::Contract& wire);

// The attention-TP width of one DP group of one stage (§10.2): prefill_tp_size / (dp * pp).
// All three must be positive and the division exact, with a result in 1..kMaxTpSize; errors
// are unsupported-layout.
absl::StatusOr<int> StageTpSize(int prefill_tp_size, int prefill_dp_size, int prefill_pp_size);

// The global prefill rank id of TP rank `stage_tp_rank` of stage `stage`.
inline int GlobalPrefillRank(int stage, int stage_tp_size, int stage_tp_rank) {
  return stage * stage_tp_size + stage_tp_rank;
}

// The planner a prefill rank of stage `stage` uses: Planner::Create(stage_tp_size,
// decode_tp_size, prefill_wire, decode, FilterFor(stage)) after ValidatePipelineLayout.
absl::StatusOr<Planner> CreateStagePlanner(const PipelineLayout& layout, int stage,
                                           int stage_tp_size, int decode_tp_size,
                                           const layout::Contract& prefill_wire,
                                           const layout::Contract& decode);

// What one prefill rank of one stage sends to the decode rank.
struct PipelineSource {
  int stage = 0;
  int stage_tp_rank = 0;
  int prefill_rank = 0;  // GlobalPrefillRank(stage, stage_tp_size, stage_tp_rank)
  // As Route::sources: at least one fragment, unless the route is a whole-field copy.
  std::vector<Fragment> fragments;
  // As Route::sources: one decision per sharded group (§12.8); empty when none is sharded.
  std::vector<GroupOwnerFilter> owner_filters;
};

// One decode rank's route across every stage.
struct PipelineRoute {
  int stage_tp_size = 1;
  // True only for one stage holding every field with stage_tp_size == D and no sharded group
  // (§6.6, §12.6).
  bool whole_field_copy = false;
  std::vector<PipelineSource> sources;  // ascending prefill_rank (stage-major)
  DecodeTargets targets;                // global rank ids
};

// Plans decode rank `decode_tp_rank` against every stage of `layout` (semantics above). Fails
// when the layout is invalid or any stage's planner or route fails; the error names the stage.
absl::StatusOr<PipelineRoute> PlanPipelineRoute(const PipelineLayout& layout, int stage_tp_size,
                                                int decode_tp_size, int decode_tp_rank,
                                                const layout::Contract& prefill_wire,
                                                const layout::Contract& decode);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_PIPELINE_H_
