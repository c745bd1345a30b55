#include "control/plan/landing_copies.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "control/plan/copy_stream.h"
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

namespace {

// Refuses a plan whose landing the decode cannot find alone; else the room's source manifest
// as the decode stands it in: `destination` with page 1 for every block.
absl::StatusOr<layout::Manifest> LandingSource(const CopyPlan& plan,
                                               const layout::Manifest& destination) {
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
  return source;
}

}  // namespace

absl::Status LandingCopies(const CopyPlan& plan, const layout::Manifest& destination, CopyList& out,
                           bool strided) {
  KVRAIL_ASSIGN_OR_RETURN(const layout::Manifest source, LandingSource(plan, destination));
  if (!strided) return plan.Expand(source, destination, out);
  KVRAIL_ASSIGN_OR_RETURN(CopyCursor cursor,
                          plan.Begin(source, destination, /*coalesce=*/false, /*strided=*/true));
  constexpr size_t kBatch = 1024;
  while (!cursor.done()) {
    Copy* batch = out.Extend(kBatch);
    out.Truncate(out.size() - kBatch + cursor.Next(batch, kBatch));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> LandingBytes(std::shared_ptr<const CopyPlan> plan,
                                      const layout::Manifest& destination) {
  KVRAIL_ASSIGN_OR_RETURN(layout::Manifest source, LandingSource(*plan, destination));
  KVRAIL_ASSIGN_OR_RETURN(
      std::unique_ptr<CopySource> stream,
      StreamRoom(std::move(plan), std::make_shared<const layout::Manifest>(std::move(source)),
                 std::make_shared<const layout::Manifest>(destination), {}, /*coalesce=*/false));
  return stream->envelope().bytes;
}

}  // namespace kvrail::plan
