#include "tests/transfer/route_fixture.h"

#include <vector>

#include "control/plan/planner.h"
#include "engine/base/error.h"

namespace kvrail::testing {

absl::StatusOr<layout::Contract> ContractFor(const RouteSetup& setup, int tp_size) {
  return layout::BuildKvContract(setup.shape, tp_size);
}

absl::StatusOr<CopyList> RoomCopies(const RouteSetup& setup, int p, int d) {
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract prefill, ContractFor(setup, setup.prefill_tp));
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract decode, ContractFor(setup, setup.decode_tp));
  KVRAIL_ASSIGN_OR_RETURN(
      const plan::Planner planner,
      plan::Planner::Create(setup.prefill_tp, setup.decode_tp, prefill, decode));
  const plan::RegistrationOutcome outcome = planner.OnRegistration(p, d);
  if (outcome.kind != plan::RegistrationOutcome::Kind::kSend) return CopyList();
  KVRAIL_ASSIGN_OR_RETURN(
      const plan::CopyPlan copy_plan,
      plan::CopyPlan::Bind(prefill, decode, outcome.fragments, outcome.owner_filters));
  std::vector<int64_t> src_ids, dst_ids;
  for (int i = 0; i < setup.room_pages; ++i) {
    src_ids.push_back(1 + i);
    dst_ids.push_back(setup.shape.pages - i);
  }
  const int64_t prompt = int64_t{setup.room_pages} * setup.shape.page_tokens;
  const std::vector<std::vector<int64_t>> src_table = {src_ids}, dst_table = {dst_ids};
  KVRAIL_ASSIGN_OR_RETURN(const layout::Manifest src,
                          layout::BuildManifest(prefill, src_table, 0, prompt));
  KVRAIL_ASSIGN_OR_RETURN(const layout::Manifest dst,
                          layout::BuildManifest(decode, dst_table, 0, prompt));
  CopyList copies;
  if (!setup.strided_copies) {
    KVRAIL_RETURN_IF_ERROR(copy_plan.ExpandCoalesced(src, dst, copies));
    return copies;
  }
  KVRAIL_ASSIGN_OR_RETURN(plan::CopyCursor cursor,
                          copy_plan.Begin(src, dst, /*coalesce=*/true, /*strided=*/true));
  Copy batch[64];
  while (const size_t n = cursor.Next(batch, 64)) {
    for (size_t i = 0; i < n; ++i) copies.push_back(batch[i]);
  }
  return copies;
}

}  // namespace kvrail::testing
