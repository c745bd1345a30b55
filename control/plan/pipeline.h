// Prefill pipeline stages (CACHEPD §10.1, §10.2): routes when the prefill model is split over
// pipeline-parallel stages, each holding the cache fields of its own layers.
//
// Semantics (the Python snapshot has no PP, §8; these follow the Rust port's excerpt, §10, and
// the reference's later `build_pipeline_transfer_plan`):
//
//   * Stages and ranks. The prefill node has pp_size stages; one DP group of one stage has
//     stage_tp_size attention-TP ranks, where stage_tp_size = prefill_tp_size /
//     (prefill_dp_size * prefill_pp_size) and prefill_tp_size is the world the bootstrap
//     reports (§10.2, StageTpSize). Prefill rank (stage s, TP rank p) has the global id
//     s * stage_tp_size + p (GlobalPrefillRank); decode-facing rank lists use global ids.
//   * Contracts. Every stage publishes the same wire contract, that of the whole model, and
//     every plan runs over the wire contracts (§10.1). fields_by_stage[s] lists the field ids
//     stage s holds; every field of the wire contract is in exactly one stage, and no other id
//     may appear (ValidatePipelineLayout).
//   * One planner per stage. Stage s is planned alone: Planner::Create(stage_tp_size, D, wire,
//     decode, filter of stage s). A prefill rank of stage s builds exactly that planner
//     (CreateStagePlanner), decides registrations with it (OnRegistration) and sends only the
//     fields of its stage; its S_p, pre-allocation count and dummy status are its stage's.
//   * A decode rank's route spans the stages (PlanPipelineRoute): stage s contributes sources
//     (s, p) for every p of its stage route, in stage-major order. Across stages:
//       E_d = { global(s, p) : p a source of stage s's route for d },
//       Z_d = { global(s, p) : S_p of stage s is empty } when d == 0, else empty,
//       T_d = the sorted union of E_d and Z_d; the decode needs |E_d| completions.
//   * Equal TP. A stage that holds only some fields routes them with the explicit fragments of
//     §6.3 even when stage_tp_size == D, since §6.6's whole-field copy would send fields the
//     stage does not hold. One stage holding every field (SingleStage, the default when a
//     bootstrap sends no stage list) is exactly §6, whole-field copy included.
//   * A stage that holds no field has no route: PlanPipelineRoute fails with that stage's
//     "has no source fragments", as the reference does.
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

// Where a prefill node's cache fields live (§10.1; the bootstrap members prefill_pp_size and
// cache_fields_by_stage of §10.2).
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
};

// One decode rank's route across every stage.
struct PipelineRoute {
  int stage_tp_size = 1;
  // True only for one stage holding every field with stage_tp_size == D (§6.6).
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
