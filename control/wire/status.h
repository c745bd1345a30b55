// The status message, Prefill → Decode: 5 frames in the snapshot (CACHEPD §3.4), 7 in the
// 2026-09 revision (CACHEPD §12.9).
//
//   0 room | 1 TransferPoll code | 2 prefill rank | 3 bootstrap token | 4 speculative ids
//   | 5 cached tokens | 6 bootstrap logprob                                  (2026-09 only)
//
// Integers are decimal text; frame 4 is little-endian int32 values, or empty for none; frame 6
// is a little-endian IEEE-754 double, or empty for none.
#ifndef KVRAIL_CONTROL_WIRE_STATUS_H_
#define KVRAIL_CONTROL_WIRE_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvrail::wire {

// The form of a status message: which revision's frames it has (CACHEPD §3.4, §12.9).
// control/wire cannot depend on control/layout (layout depends on wire), so this is wire's own
// enum; control/session maps layout::Revision onto it (StatusFormFor in prefill_rooms.cc).
enum class StatusForm {
  kSnapshot,  // 5 frames (CACHEPD §3.4)
  k2026_09,   // 7 frames: + cached tokens, bootstrap logprob (CACHEPD §12.9)
};

// The form a status of `frames` is in: 6 or more frames => 2026-09 (the lightseekorg sender at
// 30ba5379 sends 6, CACHEPD §12.0), fewer => the snapshot. This is what ParseStatus and
// ParseStatusLenient report in StatusMessage::form.
StatusForm StatusFormOf(absl::Span<const std::string> frames);

// One Prefill rank's report on a room.
struct StatusMessage {
  uint64_t room = 0;
  int status = 0;                // TransferPoll code (CACHEPD §7.1); kvrail sends 0 or 5
  uint32_t prefill_rank = 0;     // the sender's attention TP rank
  int64_t bootstrap_token = -1;  // -1 when there is none
  // nullopt = none. An empty list is sent as an empty frame and so reads back as nullopt
  // (CACHEPD §9.3).
  std::optional<std::vector<int32_t>> spec_candidate_ids;
  // 2026-09 frame 5 (CACHEPD §12.9): the prompt tokens the Prefill served from its own prefix
  // cache; 0 when none were recorded, and 0 when read from a 5-frame message.
  int64_t cached_tokens = 0;
  // 2026-09 frame 6 (CACHEPD §12.9): the log-probability of the bootstrap token; nullopt =
  // none (an empty frame, or a message of fewer than 7 frames).
  std::optional<double> bootstrap_logprob;
  // The form the parser read the message in (StatusFormOf its frames). BuildStatus does not
  // read it: it writes the form it is given, which the caller decides per peer.
  StatusForm form = StatusForm::kSnapshot;
};

// Equality of every member; logprobs compare by their bits, so a NaN equals itself.

bool operator==(const StatusMessage& a, const StatusMessage& b);
bool operator!=(const StatusMessage& a, const StatusMessage& b);

// The frames of `message` in `form`, byte for byte what the reference's
// `sync_status_to_decode_endpoint` sends: room, status and rank in canonical decimal, the token
// in signed decimal ("-1" for none), and the speculative ids as little-endian int32 (empty
// frame for nullopt or an empty list). kSnapshot: those 5 frames (CACHEPD §3.4), and
// cached_tokens and bootstrap_logprob are not sent. k2026_09: 7 frames (CACHEPD §12.9), frame 5
// the cached tokens in canonical decimal, frame 6 the logprob as 8 little-endian bytes (empty
// for nullopt). message.form is not read.
//
// Requires what ParseStatus accepts: room < 2^63, status 0..5, rank 0..1023, token -1 or
// >= 0, and in 2026-09 form cached tokens in [0, 2^48] and a logprob that is not NaN or +inf.
// Otherwise returns an invalid-frame error prefixed "cannot build status: ".
absl::StatusOr<std::vector<std::string>> BuildStatus(const StatusMessage& message, StatusForm form);

// Reads a status message strictly; this is what kvrail accepts by default. Requires 5, 6 or 7
// frames: room canonical [0, 2^63-1]; status canonical [0, 5]; rank canonical [0, 1023];
// token "-1" or canonical [0, 2^63-1]; frame 4 a multiple of 4 bytes (empty = none); frame 5
// (when present) cached tokens canonical [0, 2^48]; frame 6 (when present) empty (none) or
// exactly 8 bytes. The form is StatusFormOf(frames): 6 or 7 frames => 2026-09 (CACHEPD §12.9).
//
// Non-finite logprobs: the reference accepts NaN and both infinities (CACHEPD §12.9); this
// reader rejects NaN and +inf, which no log-probability can be, and accepts -inf, the log of a
// probability that underflowed to 0. A strict reader that dropped -inf would leave the room to
// its timeout for a value a real sampler can produce.
// Every error is invalid-frame and names the frame and rule.
absl::StatusOr<StatusMessage> ParseStatus(absl::Span<const std::string> frames);

// Reads a status message as the reference's `parse_prefill_status_message` does (CACHEPD
// §3.4), for peers that send non-canonical text. At least 3 frames; frames 0 to 3 ASCII and
// read like Python int() (see ParsePythonInt: spaces, sign, leading zeros, '_'); frame 3
// optional (token -1 when absent); frame 4 optional, a multiple of 4 bytes, empty = none;
// extra frames ignored. Any status and any token that fit the struct are accepted.
// 2026-09 frames as the newer reference reads them (CACHEPD §12.9), frame 6 before frame 5:
// frame 6, when there are more than 6 frames and it is not empty, must be exactly 8 bytes
// (a little-endian double; NaN and infinities accepted); frame 5, when there are more than 5
// frames, is read like Python int() (an empty frame 5 is an error). Frames after 6 are ignored.
// Negative cached tokens are accepted, as the reference accepts them: the decode keeps the
// maximum with 0 (CACHEPD §12.9), so a negative count never reaches an engine.
//
// Deliberate divergences: where the reference keeps Python's unbounded integers, a room
// outside [0, 2^63-1], a status outside int, a rank outside [0, 2^32-1] or a token outside
// int64 is rejected. No such room or rank can be tracked, so the reference ignores such a
// message or fails the room; kvrail drops it. Every error is invalid-frame.
absl::StatusOr<StatusMessage> ParseStatusLenient(absl::Span<const std::string> frames);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_STATUS_H_
