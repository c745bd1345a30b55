// kvrail's room outcome message: what a kvrail prefill rank tells a kvrail decode of a room it
// ended, beside CachePD's status, which stays byte for byte the same (kvrail_frames.h: a peer
// that is not kvrail drops it, CACHEPD §3.2.1, and a tokenspeed decode is never sent one).
//
//   Prefill → Decode, right before the Success or Failed status (CACHEPD §3.4) of a room, on the
//   same route, to a kvrail decode session only:
//     0 kRoomOutcomeMagic | 1 room | 2 prefill rank (the status's frame 2) | 3 bytes | 4 copies
//     | 5 cause | 6 reason
//
// Bytes and copies: what this rank wrote to that session for the room (0 on a Failed). Cause:
// the word of the prefill's failure (control/session/failure_cause.h: "aborted", "timeout",
// ...), empty on a Success; reason: its sentence, one line. CachePD's Failed carries neither, so
// the decode could only say "it might be dead"; with this message it names the prefill's own.
// Room, rank, bytes and copies are canonical decimal (§3.1). Proven like the status after it
// (proof.h) to a session whose key the prefill holds.
#ifndef KVRAIL_CONTROL_WIRE_OUTCOME_H_
#define KVRAIL_CONTROL_WIRE_OUTCOME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

inline constexpr absl::string_view kRoomOutcomeMagic = "\xffkvrail.outcome.v1";
inline constexpr size_t kMaxOutcomeCauseBytes = 32;
inline constexpr size_t kMaxOutcomeReasonBytes = 2048;

struct RoomOutcomeMessage {
  uint64_t room = 0;
  uint32_t prefill_rank = 0;
  uint64_t bytes = 0;
  uint64_t copies = 0;
  std::string cause;   // a-z and '_', at most kMaxOutcomeCauseBytes; empty for a Success
  std::string reason;  // no byte below 0x20, at most kMaxOutcomeReasonBytes
};

bool IsRoomOutcome(absl::Span<const std::string> frames);

// invalid-frame naming the frame and rule: not 7 frames, another magic, a room, rank, bytes or
// copies that is not canonical decimal ([0, 2^63-1], [0, 1023], [0, 2^63-1], [0, 2^63-1]), a
// cause of other characters or longer than allowed, a reason with a control byte or too long.
absl::StatusOr<RoomOutcomeMessage> ParseRoomOutcome(absl::Span<const std::string> frames);
absl::StatusOr<std::vector<std::string>> BuildRoomOutcome(const RoomOutcomeMessage& message);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_OUTCOME_H_
