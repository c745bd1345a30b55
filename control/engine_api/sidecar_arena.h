// The engine's side of an arena its sidecar allocated (AttachArena.allocate_bytes,
// proto/kvrail/v1/engine.proto): the sidecar answers with a path to the memory's fd in its own
// /proc entry and an offset into that file; the engine maps the file and keeps the mapping.
#ifndef KVRAIL_CONTROL_ENGINE_API_SIDECAR_ARENA_H_
#define KVRAIL_CONTROL_ENGINE_API_SIDECAR_ARENA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/memory/arena.h"
#include "proto/kvrail/v1/engine.pb.h"

namespace kvrail::engine_api {

// The arena in this process: `bytes()` are the same pages the sidecar registered, valid while
// `mapping` lives (even after the sidecar has stopped). Move-only.
struct SidecarArena {
  Arena mapping;          // the whole file behind the reply's arena_path
  uint64_t offset = 0;    // where the arena starts in `mapping`
  uint64_t length = 0;    // the bytes asked for
  std::string placement;  // the reply's arena_placement ("ucx-shm", "memfd")
  std::string path;       // the reply's arena_path

  absl::Span<uint8_t> bytes() const { return absl::MakeSpan(mapping.data() + offset, length); }
};

// Opens `reply.arena_path()` read-write (close-on-exec), maps the whole file (Arena::FromFd)
// and checks that it holds `length` bytes from `reply.arena_offset()`. InvalidArgument when the
// reply names no path (it did not answer an AttachArena with allocate_bytes) or the file is too
// small (naming both sizes); the failing call and its errno when the path cannot be opened (the
// sidecar stopped, or runs in another pid namespace).
absl::StatusOr<SidecarArena> MapSidecarArena(const v1::EngineReply& reply, uint64_t length);

}  // namespace kvrail::engine_api

#endif  // KVRAIL_CONTROL_ENGINE_API_SIDECAR_ARENA_H_
