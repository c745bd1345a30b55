// TransferPoll codes and the forward-only update rule (CACHEPD §7.1), shared by both roles.
#ifndef KVRAIL_CONTROL_SESSION_TRANSFER_POLL_H_
#define KVRAIL_CONTROL_SESSION_TRANSFER_POLL_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace kvrail::session {

// A room's state, with the reference's numeric codes: the status frame carries them as decimal
// text (CACHEPD §3.4), and a node all-reduces them over its TP group with MIN (§1.4).
enum class TransferPoll : int {
  kFailed = 0,           // both roles; sticky
  kBootstrapping = 1,    // both roles; the initial state
  kBootstrapped = 2,     // both roles
  kWaitingForInput = 3,  // decode only
  kTransferring = 4,     // unused by the reference; a decode that sees it only logs (§7.1)
  kSuccess = 5,          // both roles
};

// "Failed", "Bootstrapping", ... as the reference names them.
absl::string_view TransferPollName(TransferPoll poll);

// The code for `code`, or nullopt outside 0..5.
std::optional<TransferPoll> TransferPollFromCode(int code);

constexpr int TransferPollCode(TransferPoll poll) { return static_cast<int>(poll); }

// `update_status(room, update)` of CACHEPD §7.1, for a room whose entry is `current`:
//   * no entry yet (nullopt): the entry becomes `update`, whatever it is;
//   * else Failed on either side gives Failed: Failed is sticky;
//   * else max(current, update): a state never moves backwards.
TransferPoll UpdateTransferPoll(std::optional<TransferPoll> current, TransferPoll update);

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_TRANSFER_POLL_H_
