#include "control/plan/landing_copies.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "control/plan/pipeline.h"
#include "control/plan/planner.h"
#include "engine/base/error.h"

namespace kvrail::plan {

absl::StatusOr<CopyPlan> LandingPlan(const PrefillDescription& node, int decode_tp_size,
                                     int decode_tp_rank, const layout::Contract& decode,
                                     int prefill_rank) {
  const std::string context = absl::StrCat("copies of prefill rank ", prefill_rank);
  const int stage_tp = node.stage_tp_size;
  if (stage_tp < 1 || prefill_rank < 0 || prefill_rank >= stage_tp * node.pp_size) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     absl::StrCat(context, ": the node has ", node.pp_size, " stage(s) of ",
                                  stage_tp, " rank(s)"));
  }
  const int stage = prefill_rank / stage_tp;
  const int p = prefill_rank % stage_tp;
  // As PrefillRooms::PlannerFor: one stage holding every field plans without a filter.
  std::optional<StageFilter> filter;
  if (node.pp_size > 1) {
    KVRAIL_RETURN_IF_ERROR(
        AddContext(ValidatePipelineLayout(node.pipeline, node.contract), context));
    filter = node.pipeline.FilterFor(stage);
  }
  absl::StatusOr<Planner> planner =
      Planner::Create(stage_tp, decode_tp_size, node.contract, decode, filter ? &*filter : nullptr);
  if (!planner.ok()) return AddContext(planner.status(), context);
  const RegistrationOutcome outcome = planner->OnRegistration(p, decode_tp_rank);
  if (outcome.kind != RegistrationOutcome::Kind::kSend) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     absl::StrCat(context, ": it sends decode rank ", decode_tp_rank, " no data (",
                                  OutcomeName(outcome.kind), ")"));
  }
  absl::StatusOr<CopyPlan> bound =
      CopyPlan::Bind(node.contract, decode, outcome.fragments, outcome.owner_filters);
  if (!bound.ok()) return AddContext(bound.status(), context);
  return bound;
}

absl::Status LandingCopies(const CopyPlan& plan, const layout::Manifest& destination,
                           CopyList& out) {
  for (const BoundFragment& fragment : plan.fragments()) {
    if (fragment.owner.owner_count > 1) {
      return MakeError(ErrorCategory::kUnsupportedLayout,
                       "the prefill shards a cache group over pages: which decode blocks each "
                       "owner writes follows the prefill's virtual block ids, which the decode "
                       "does not know (CACHEPD §12.8)");
    }
  }
  layout::Manifest source = destination;
  for (layout::ManifestGroup& group : source.groups) {
    for (int64_t& block : group.block_ids) block = 1;
  }
  return plan.Expand(source, destination, out);
}

}  // namespace kvrail::plan
