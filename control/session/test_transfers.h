// Test support: the data plane's side of PrefillRooms, as the sidecar drives it
// (control/sidecar/prefill_transfers.cc), without a data plane: a work is prepared with one
// transfer per data destination and submitted, and each transfer's outcome is reported.
#ifndef KVRAIL_CONTROL_SESSION_TEST_TRANSFERS_H_
#define KVRAIL_CONTROL_SESSION_TEST_TRANSFERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "control/session/failure_cause.h"
#include "control/session/prefill_rooms.h"

namespace kvrail::session::testing {

// Appends what `from` asks to `into`, in order.
void Append(PrefillOutput& into, PrefillOutput from);

// Prepares `work` with one transfer per data destination (a dummy has none) and returns their
// ids, submitted; `out` gets what that ended (PrefillRooms::TransfersPrepared).
std::vector<uint64_t> Post(PrefillRooms& rooms, const TransferWork& work, absl::Time now,
                           PrefillOutput& out);

// Every transfer of `room` lands: each submitted one reports success with the copies
// `copies_by_session` gives its session, and each work still being prepared is prepared with
// nothing to move. FailedPrecondition when the room has no transfers.
absl::StatusOr<PrefillOutput> LandAll(
    PrefillRooms& rooms, uint64_t room, absl::Time now,
    const std::map<std::string, uint64_t>& copies_by_session = {});

// The room's transfers fail: the first submitted one reports a failure (`reason`, with a status
// whose FailureCauseOf is `cause`, blaming `failed_session`: empty for nobody) and every other
// reports cancelled; a room with nothing submitted has its first preparation fail instead.
// `fence_proven` goes with every outcome. Nothing when the room has no transfers.
PrefillOutput FailAll(PrefillRooms& rooms, uint64_t room, absl::string_view failed_session,
                      absl::string_view reason, absl::Time now, bool fence_proven = true,
                      FailureCause cause = FailureCause::kTransport);

}  // namespace kvrail::session::testing

#endif  // KVRAIL_CONTROL_SESSION_TEST_TRANSFERS_H_
