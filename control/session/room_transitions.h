// The state changes each role's room ledger makes, as one table per role, and what makes each
// (docs/ARCHITECTURE.md, "A room's life"). Every state change of PrefillRooms and DecodeRooms goes
// through NextRoomState (their SetState): CACHEPD §7.1's update rule (UpdateTransferPoll: Failed
// is sticky, nothing moves backwards) says where an update would move a room, and the role's table
// says whether that move is one the role makes. A move the table does not list is not made, and
// is counted (unlisted_moves() of each ledger), so that a test finds it: the randomized room world
// (room_world.h) checks after every step that there was none.
#ifndef KVRAIL_CONTROL_SESSION_ROOM_TRANSITIONS_H_
#define KVRAIL_CONTROL_SESSION_ROOM_TRANSITIONS_H_

#include <optional>
#include <string_view>

#include "absl/types/span.h"
#include "control/session/transfer_poll.h"

namespace kvrail::session {

// Whose ledger: a prefill rank's (PrefillRooms) or a decode rank's (DecodeRooms).
enum class LedgerRole { kPrefill, kDecode };

// One move a ledger makes: from `from` (nullopt: a room the ledger has no state of yet) to `to`,
// on `on`.
struct RoomTransition {
  std::optional<TransferPoll> from;
  TransferPoll to;
  std::string_view on;
};

// The role's table, in the order a room goes through it.
absl::Span<const RoomTransition> RoomTransitions(LedgerRole role);

// Where `update` moves a room now in `current`: the state CACHEPD §7.1's rule gives, when it
// differs from `current` and the role's table lists the move. nullopt when nothing changes, with
// `*unlisted` set when the rule would have moved the room and the table does not list the move.
std::optional<TransferPoll> NextRoomState(LedgerRole role, std::optional<TransferPoll> current,
                                          TransferPoll update, bool* unlisted);

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_ROOM_TRANSITIONS_H_
