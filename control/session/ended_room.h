// The one refusal of an engine call about a room that already ended (docs/ENGINE-API.md,
// "Exactly one terminal event"): it states the room's true end, and reports nothing again.
#ifndef KVRAIL_CONTROL_SESSION_ENDED_ROOM_H_
#define KVRAIL_CONTROL_SESSION_ENDED_ROOM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "control/session/transfer_poll.h"

namespace kvrail::session {

// FailedPrecondition: "room N already failed: <reason>" for kFailed, "room N already succeeded"
// for kSuccess. The room's terminal event went out once, when it ended; the refusal lends and
// returns no pages (who holds them was said by that event).
absl::Status EndedRoomError(uint64_t room, TransferPoll state, absl::string_view reason);

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_ENDED_ROOM_H_
