// kvrail's proofs of who sent a CachePD message (docs/SECURITY.md), beside CachePD's own frames,
// which stay byte for byte the same (kvrail_frames.h: a peer that is not kvrail drops these).
//
// A kvrail decode sidecar holds a random 32-byte session key; the descriptor its handshake
// endpoint serves carries the key's digest (v1.HandshakeDescriptor.session_key_digest), so a
// prefill that fetched the descriptor from the session's own endpoint can tell the key from any
// other, while nobody learns the key from the digest.
//
//   owner proof, Decode → Prefill, right before each pre-allocation and fence request it sends,
//   on the same PUSH route:
//     0 kOwnerProofMagic | 1 room | 2 decode session id | 3 the session key (32 bytes)
//
// A prefill that admitted the session's registration with a digest takes a pre-allocation or a
// fence request naming that session only right after an owner proof of the same room whose key
// matches the digest: a third party that can reach the prefill's PULL socket, but not read the
// decode's traffic, cannot write into the session's pages or abort its rooms. Room is canonical
// decimal (CACHEPD §3.1).
//
//   sender proof, Prefill → Decode, right before each status frame (CACHEPD §3.4) it sends to a
//   session whose key it holds (from that session's owner proofs), on the same route:
//     0 kSenderProofMagic | 1 room | 2 prefill rank (the status's frame 2) | 3 tag (32 bytes)
//
// The tag is the session key's keyed digest of the status's own frames (SessionKey::Tag), so
// only a holder of the key (the decode itself, or a prefill it sent proofs to) can make one,
// and it vouches for that status alone: a decode that requires sender proofs from a prefill
// node takes a Success or Failed from it only right after a proof whose tag matches.
#ifndef KVRAIL_CONTROL_WIRE_PROOF_H_
#define KVRAIL_CONTROL_WIRE_PROOF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

inline constexpr absl::string_view kOwnerProofMagic = "\xffkvrail.owner.v1";
inline constexpr size_t kSessionKeyBytes = 32;

struct OwnerProof {
  uint64_t room = 0;
  std::string session_id;
  std::string key;  // kSessionKeyBytes bytes
};

inline constexpr absl::string_view kSenderProofMagic = "\xffkvrail.sender.v1";
inline constexpr size_t kTagBytes = 32;

struct SenderProof {
  uint64_t room = 0;
  uint32_t prefill_rank = 0;
  std::string tag;  // kTagBytes bytes
};

bool IsOwnerProof(absl::Span<const std::string> frames);
bool IsSenderProof(absl::Span<const std::string> frames);

// invalid-frame naming the frame and rule: not 4 frames, another magic, a room that is not
// canonical decimal in [0, 2^63-1], a session id of 0 or more than 512 bytes, a key that is not
// kSessionKeyBytes bytes.
absl::StatusOr<OwnerProof> ParseOwnerProof(absl::Span<const std::string> frames);
absl::StatusOr<std::vector<std::string>> BuildOwnerProof(const OwnerProof& proof);

// The room of a message an owner proof must precede (a pre-allocation, a fence request or a
// staging offer, row_staging.h, whose room frame parses), or nullopt for any other message.
std::optional<uint64_t> ProvenRoomOf(absl::Span<const std::string> frames);

// invalid-frame naming the frame and rule: not 4 frames, another magic, a room or rank that is
// not canonical decimal ([0, 2^63-1], [0, 1023]), a tag that is not kTagBytes bytes.
absl::StatusOr<SenderProof> ParseSenderProof(absl::Span<const std::string> frames);
absl::StatusOr<std::vector<std::string>> BuildSenderProof(const SenderProof& proof);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_PROOF_H_
