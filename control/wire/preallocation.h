// The pre-allocation message, Decode → Prefill (CACHEPD §3.3): exactly 3 frames.
//
//   0 room | 1 session id | 2 manifest wire, or zero bytes for a dummy target
//
// This package checks the frames; the manifest bytes are opaque here and are parsed by the
// layout package (CACHEPD §5).
#ifndef KVRAIL_CONTROL_WIRE_PREALLOCATION_H_
#define KVRAIL_CONTROL_WIRE_PREALLOCATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvrail::wire {

// One Decode rank's request that a Prefill rank send it a room's cache.
struct Preallocation {
  uint64_t room = 0;          // 0..2^63-1
  std::string session_id;     // ASCII, 1..512 bytes
  std::string manifest_wire;  // manifest bytes as sent, 0..2097152 bytes; empty = dummy target

  // True for a rendezvous-only target, which is sent an empty manifest frame (CACHEPD §6.5).
  bool is_dummy() const { return manifest_wire.empty(); }
};

bool operator==(const Preallocation& a, const Preallocation& b);
bool operator!=(const Preallocation& a, const Preallocation& b);

// Frames 0 and 1 of a pre-allocation: enough to abort the room and answer the sender.
struct PreallocationRouteHeader {
  uint64_t room = 0;
  std::string session_id;
};

bool operator==(const PreallocationRouteHeader& a, const PreallocationRouteHeader& b);
bool operator!=(const PreallocationRouteHeader& a, const PreallocationRouteHeader& b);

// Reads frames 0 and 1 (the reference's `route_header_from_zmq`), in the order of CACHEPD
// §3.3: exactly 3 frames; room canonical [0, 2^63-1]; session id ASCII, 1..512 bytes.
// Frame 2 is not looked at. Every error is invalid-frame and names the frame and rule.
absl::StatusOr<PreallocationRouteHeader> ParsePreallocationRouteHeader(
    absl::Span<const std::string> frames);

// Reads a whole pre-allocation: the route header as above, then frame 2 either empty (a dummy
// target) or 1..2097152 bytes. Only the size is checked here; whether the bytes are a valid
// manifest is for the layout package to say. Every error is invalid-frame.
absl::StatusOr<Preallocation> ParsePreallocation(absl::Span<const std::string> frames);

// The 3 frames of `preallocation`: room in canonical decimal, session id, manifest bytes as
// given. Fails, with an invalid-frame error prefixed "cannot build pre-allocation: ", exactly
// when ParsePreallocation would reject those frames; so a result always parses back to
// `preallocation`. Emitting the manifest's canonical form (CACHEPD §5.1) is the caller's job.
absl::StatusOr<std::vector<std::string>> BuildPreallocation(const Preallocation& preallocation);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_PREALLOCATION_H_
