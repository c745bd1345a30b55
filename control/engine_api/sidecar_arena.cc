#include "control/engine_api/sidecar_arena.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace kvrail::engine_api {

absl::StatusOr<SidecarArena> MapSidecarArena(const v1::EngineReply& reply, uint64_t length) {
  const std::string& path = reply.arena_path();
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "sidecar arena: the reply has no arena_path (it answers AttachArena with allocate_bytes "
        "only)");
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    return absl::UnavailableError(absl::StrFormat("sidecar arena %s: open failed: %s (errno %d)",
                                                  path, std::strerror(error), error));
  }
  absl::StatusOr<Arena> mapping = Arena::FromFd(fd);
  close(fd);  // the mapping holds its own duplicate
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(),
                        absl::StrFormat("sidecar arena %s: %s", path, mapping.status().message()));
  }
  const uint64_t offset = reply.arena_offset();
  if (offset > mapping->size() || mapping->size() - offset < length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sidecar arena %s: the file holds %d bytes; arena_offset %d + %d arena bytes do not fit",
        path, mapping->size(), offset, length));
  }
  return SidecarArena{*std::move(mapping), offset, length, reply.arena_placement(), path};
}

}  // namespace kvrail::engine_api
