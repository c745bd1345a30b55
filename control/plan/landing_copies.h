// Where one prefill rank's copies of a room land in a decode rank's arena, found by the decode
// alone (`--verify-digest`, room_digest.h): the decode hashes the bytes that landed without the
// prefill's source manifest or copy list.
//
// The decode knows what the prefill rank plans with: the node's description (its wire contract,
// stage TP size and pipeline stages, from the bootstrap server, CACHEPD §2.2, §10.2), its own
// contract and TP coordinates (what its registration says, §3.2), and its own destination
// manifest. LandingPlan runs the planner a prefill rank of that stage runs on the registration
// (PrefillRooms: Planner::Create for the rank's stage, OnRegistration(p, d), CopyPlan::Bind),
// so both sides bind the same fragments and owner filters.
//
// Destination offsets depend on the destination blocks and the fragments, never on source block
// ids; so LandingCopies pairs every destination block with source page 1. The one exception is
// a page-sharded prefill group (§12.8): which positions an owner writes follows its virtual
// source ids, so such a plan has no landing the decode can find alone. Only the source offsets it
// reports are fictitious, and the decode never reads them. Coalescing depends on source adjacency,
// so the copies may be cut differently from the prefill's: the digest, taken in destination order,
// does not mind.
#ifndef KVRAIL_CONTROL_PLAN_LANDING_COPIES_H_
#define KVRAIL_CONTROL_PLAN_LANDING_COPIES_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/prefill_description.h"

namespace kvrail::plan {

// The copy plan prefill rank `prefill_rank` of `node` (its global rank, stage * P + p, as its
// status frames carry it, §10.1) binds for decode rank `decode_tp_rank` of `decode_tp_size`
// with contract `decode`. Errors (unsupported-layout) name the rank: a rank outside the node,
// a rank that sends this decode rank nothing (a dummy or a rejection), the planner's own.
absl::StatusOr<CopyPlan> LandingPlan(const PrefillDescription& node, int decode_tp_size,
                                     int decode_tp_rank, const layout::Contract& decode,
                                     int prefill_rank);

// Appends the copies `plan` makes for a room pre-allocated at `destination` (which must pass
// CopyPlan::Expand's checks, with every block a page of the decode's contract), with source
// page 1 for every block: a copy per row, or with `strided` each head-sliced page's rows as one
// strided copy (CopyPlan::Begin), which lands the same bytes. Errors as Expand's;
// unsupported-layout for a plan with an owner filter (a page-sharded group, §12.8).
absl::Status LandingCopies(const CopyPlan& plan, const layout::Manifest& destination, CopyList& out,
                           bool strided = false);

// The bytes LandingCopies lands for `destination` (the sum over its copies' rows), from the
// plan's envelope of the room (a pass over fragments and blocks, not rows). Errors as
// LandingCopies's.
absl::StatusOr<uint64_t> LandingBytes(std::shared_ptr<const CopyPlan> plan,
                                      const layout::Manifest& destination);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_LANDING_COPIES_H_
