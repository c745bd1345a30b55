// kvrail's room digest message (`--verify-digest`, docs/SECURITY.md, "Digests"), beside
// CachePD's own frames, which stay byte for byte the same (kvrail_frames.h: a peer that is not
// kvrail drops it, CACHEPD §3.2.1).
//
//   Prefill → Decode, right before the Success status (CACHEPD §3.4) of a room, on the same
//   route, to a kvrail decode session only:
//     0 kRoomDigestMagic | 1 room | 2 prefill rank (the status's frame 2) | 3 digest
//
// The digest is control/plan/room_digest.h's over the bytes this rank wrote to that session for
// the room, 8 bytes little-endian. It is a message of its own, not a status frame, so CachePD's
// status stays as the reference parses it; to a session whose key the prefill holds it goes with
// a sender proof of its own (proof.h), like the status after it, so a third party cannot make a
// room fail by sending a wrong digest. Room and rank are canonical decimal (§3.1).
#ifndef KVRAIL_CONTROL_WIRE_DIGEST_H_
#define KVRAIL_CONTROL_WIRE_DIGEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

inline constexpr absl::string_view kRoomDigestMagic = "\xffkvrail.digest.v1";
inline constexpr size_t kRoomDigestBytes = 8;

struct RoomDigestMessage {
  uint64_t room = 0;
  uint32_t prefill_rank = 0;
  uint64_t digest = 0;
};

bool IsRoomDigest(absl::Span<const std::string> frames);

// invalid-frame naming the frame and rule: not 4 frames, another magic, a room or rank that is
// not canonical decimal ([0, 2^63-1], [0, 1023]), a digest that is not kRoomDigestBytes bytes.
absl::StatusOr<RoomDigestMessage> ParseRoomDigest(absl::Span<const std::string> frames);
absl::StatusOr<std::vector<std::string>> BuildRoomDigest(const RoomDigestMessage& message);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_DIGEST_H_
