#include "control/session/ended_room.h"

#include "absl/strings/str_cat.h"

namespace kvrail::session {

absl::Status EndedRoomError(uint64_t room, TransferPoll state, absl::string_view reason) {
  if (state == TransferPoll::kSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("room ", room, " already succeeded"));
  }
  return absl::FailedPreconditionError(absl::StrCat("room ", room, " already failed: ", reason));
}

}  // namespace kvrail::session
