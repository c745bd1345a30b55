// What a room state machine hands back to its caller: the messages to push to peers and the
// room state changes to report. The state machines never send anything themselves.
#ifndef KVRAIL_CONTROL_SESSION_ROOM_OUTPUT_H_
#define KVRAIL_CONTROL_SESSION_ROOM_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "control/session/failure_cause.h"
#include "control/session/transfer_poll.h"

namespace kvrail::session {

// One multipart ZMQ message for the PULL socket at `endpoint` ("tcp://host:port"), to be sent
// on the PUSH socket cached for that endpoint, in the order given (CACHEPD §1.1).
struct OutboundMessage {
  std::string endpoint;
  std::vector<std::string> frames;
};

// What a decode engine may do with a room's pages once the room ended (docs/ENGINE-API.md,
// "When pages are safe").
enum class Pages {
  kUnspecified,  // not a decode room's end
  kReusable,     // no prefill rank can write them any more: reuse them now
  kHeld,         // a prefill rank may still write them: wait for the room's PagesRelease
};

// A decode rank's pre-allocation of a room, as a prefill engine needs it to build the room's
// source manifest: the window [prefix_len, prompt_len) of the decode's manifest (CACHEPD §5.1).
struct DecodeWindow {
  std::string session_id;
  uint32_t decode_tp_rank = 0;
  int64_t prefix_len = 0;
  int64_t prompt_len = 0;
};

// A room's state changed to `state`.
struct RoomEvent {
  uint64_t room = 0;
  TransferPoll state = TransferPoll::kBootstrapping;
  // kFailed: why, in one line, and as a value from a fixed list. Empty and kNone otherwise.
  std::string reason;
  FailureCause cause = FailureCause::kNone;
  // Decode kSuccess only: the bootstrap token and speculative ids taken from the first Success
  // that carried each (CACHEPD §1.4); -1 and nullopt when none did.
  int64_t bootstrap_token = -1;
  std::optional<std::vector<int32_t>> spec_candidate_ids;
  // Decode kSuccess only (CACHEPD §12.9): the prompt tokens the prefill served from its own
  // prefix cache, the maximum over every Success of an expected rank (0 when only 5-frame
  // senders answered), and the bootstrap token's log-probability from the first Success that
  // carried one (nullopt when none did).
  int64_t cached_tokens = 0;
  std::optional<double> bootstrap_logprob;
  // Decode kSuccess: what landed here, the sum over the expected prefill ranks of what each
  // said it wrote here (kvrail's room outcome, wire/outcome.h; 0 from a rank that is not
  // kvrail), and the time from the pre-allocations to the Success.
  uint64_t bytes = 0;
  uint64_t copies = 0;
  absl::Duration elapsed;
  // Decode kFailed: whether the pages may be reused now.
  Pages pages = Pages::kUnspecified;
  // Prefill kBootstrapped: each data destination's window, in the order they pre-allocated;
  // and whether the engine is owed this event (it began the room with Begin: once per room,
  // PrefillRooms::BeginRoom).
  std::vector<DecodeWindow> windows;
  bool announce = false;
};

// Decode: the pages of a room that failed with Pages::kHeld are the engine's again.
struct PagesRelease {
  uint64_t room = 0;
  // Every prefill rank that may have written the room answered its fence: no write of it can
  // land any more. False: some did not answer within the fence wait (a peer that is not kvrail,
  // or one that is gone or unreachable), and `reason` names them: not provably safe.
  bool proven = false;
  std::string reason;
  absl::Duration waited;
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_ROOM_OUTPUT_H_
