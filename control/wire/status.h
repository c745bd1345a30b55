// The status message, Prefill → Decode (CACHEPD §3.4): 5 frames.
//
//   0 room | 1 TransferPoll code | 2 prefill rank | 3 bootstrap token | 4 speculative ids
//
// Integers are decimal text; frame 4 is little-endian int32 values, or empty for none.
#ifndef KVRAIL_CONTROL_WIRE_STATUS_H_
#define KVRAIL_CONTROL_WIRE_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvrail::wire {

// One Prefill rank's report on a room.
struct StatusMessage {
  uint64_t room = 0;
  int status = 0;                // TransferPoll code (CACHEPD §7.1); kvrail sends 0 or 5
  uint32_t prefill_rank = 0;     // the sender's attention TP rank
  int64_t bootstrap_token = -1;  // -1 when there is none
  // nullopt = none. An empty list is sent as an empty frame and so reads back as nullopt
  // (CACHEPD §9.3).
  std::optional<std::vector<int32_t>> spec_candidate_ids;
};

bool operator==(const StatusMessage& a, const StatusMessage& b);
bool operator!=(const StatusMessage& a, const StatusMessage& b);

// The 5 frames of `message`, byte for byte what the reference's
// `sync_status_to_decode_endpoint` sends: room, status and rank in canonical decimal, the token
// in signed decimal ("-1" for none), and the speculative ids as little-endian int32 (empty
// frame for nullopt or an empty list).
//
// Requires what ParseStatus accepts: room < 2^63, status 0..5, rank 0..1023, token -1 or
// >= 0. Otherwise returns an invalid-frame error prefixed "cannot build status: ".
absl::StatusOr<std::vector<std::string>> BuildStatus(const StatusMessage& message);

// Reads a status message strictly; this is what kvrail accepts by default. Requires exactly
// 5 frames: room canonical [0, 2^63-1]; status canonical [0, 5]; rank canonical [0, 1023];
// token "-1" or canonical [0, 2^63-1]; frame 4 a multiple of 4 bytes (empty = none).
// Every error is invalid-frame and names the frame and rule.
absl::StatusOr<StatusMessage> ParseStatus(absl::Span<const std::string> frames);

// Reads a status message as the reference's `parse_prefill_status_message` does (CACHEPD
// §3.4), for peers that send non-canonical text. At least 3 frames; frames 0 to 3 ASCII and
// read like Python int() (see ParsePythonInt: spaces, sign, leading zeros, '_'); frame 3
// optional (token -1 when absent); frame 4 optional, a multiple of 4 bytes, empty = none;
// extra frames ignored. Any status and any token that fit the struct are accepted.
//
// Deliberate divergences: where the reference keeps Python's unbounded integers, a room
// outside [0, 2^63-1], a status outside int, a rank outside [0, 2^32-1] or a token outside
// int64 is rejected. No such room or rank can be tracked, so the reference ignores such a
// message or fails the room; kvrail drops it. Every error is invalid-frame.
absl::StatusOr<StatusMessage> ParseStatusLenient(absl::Span<const std::string> frames);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_STATUS_H_
