// kvrail's fence messages beside CachePD (docs/ENGINE-API.md, "When pages are safe").
//
// CachePD carries no Decode → Prefill abort (CACHEPD §1.5): a decode that gives a room up would
// hand its pages back while a prefill may still be writing them. Between kvrail sidecars the
// decode asks each prefill rank that may write the room to fence it, on the same PUSH → PULL
// route its pre-allocation took (so the request never overtakes the pre-allocation it fences),
// and the prefill answers on the route of the decode's registration once no write of the room
// to that decode can land any more:
//
//   request, Decode → Prefill:  0 kFenceRequestMagic | 1 room | 2 decode session id
//   answer,  Prefill → Decode:  0 kFencedMagic       | 1 room | 2 prefill rank (status rank)
//                                | 3 "proven" or "unproven"
//
// "unproven": the prefill fenced the room by disconnecting a data plane that did not drain, on
// a transport where writes it had already handed over may still land (engine/transport,
// Capabilities::disconnect_fences).
//
// Frame 0 starts with byte 0xFF, so it is not ASCII: a CachePD peer that is not kvrail drops
// and logs the message (CACHEPD §3.2.1) and no CachePD message can be mistaken for one. Room
// and rank are canonical decimal (CACHEPD §3.1). The CachePD frames themselves are unchanged.
#ifndef KVRAIL_CONTROL_WIRE_FENCE_H_
#define KVRAIL_CONTROL_WIRE_FENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

inline constexpr absl::string_view kFenceRequestMagic = "\xffkvrail.fence.v1";
inline constexpr absl::string_view kFencedMagic = "\xffkvrail.fenced.v1";

struct FenceRequest {
  uint64_t room = 0;
  std::string session_id;  // the decode's data-plane session (its registration's frame 3)
};

struct FencedAnswer {
  uint64_t room = 0;
  uint32_t prefill_rank = 0;  // as in the prefill's status frames (CACHEPD §3.4, §10.1)
  bool proven = true;         // false: "unproven" (see above)
};

// Whether frame 0 of `frames` is one of the magics above (the message is kvrail's own).
bool IsFenceRequest(absl::Span<const std::string> frames);
bool IsFencedAnswer(absl::Span<const std::string> frames);

// Requires room <= 2^63-1 and a session id of 1 to 512 bytes; invalid-frame error otherwise.
absl::StatusOr<std::vector<std::string>> BuildFenceRequest(const FenceRequest& request);
// Exactly 3 frames, magic, canonical room, session id of 1 to 512 bytes; every error is
// invalid-frame and names the frame and the rule.
absl::StatusOr<FenceRequest> ParseFenceRequest(absl::Span<const std::string> frames);

// Requires room <= 2^63-1 and rank <= 1023 (CACHEPD §10.1 global ranks fit as well).
absl::StatusOr<std::vector<std::string>> BuildFencedAnswer(const FencedAnswer& answer);
// Exactly 4 frames; frame 3 is "proven" or "unproven".
absl::StatusOr<FencedAnswer> ParseFencedAnswer(absl::Span<const std::string> frames);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_FENCE_H_
