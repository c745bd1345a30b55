#include "engine/transport/shared_region.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

namespace kvrail::transport {
namespace {

struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t offset = 0;
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  uint64_t inode = 0;
  std::string path;
};

// One line of /proc/self/maps: "start-end perms offset major:minor inode [path]".
bool ParseMapsLine(const std::string& line, Mapping& m) {
  char perms[8] = {};
  int path_at = 0;
  if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64 " %n",
                  &m.start, &m.end, perms, &m.offset, &m.dev_major, &m.dev_minor, &m.inode,
                  &path_at) < 7) {
    return false;
  }
  m.path = path_at > 0 && static_cast<size_t>(path_at) <= line.size() ? line.substr(path_at) : "";
  return true;
}

}  // namespace

absl::StatusOr<BackingFd> FindBackingFd(const void* address) {
  const uint64_t at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  if (!maps) return absl::UnavailableError("FindBackingFd: cannot read /proc/self/maps");
  Mapping found;
  bool have = false;
  for (std::string line; std::getline(maps, line);) {
    Mapping m;
    if (ParseMapsLine(line, m) && m.start <= at && at < m.end) {
      found = std::move(m);
      have = true;
      break;
    }
  }
  if (!have) {
    return absl::NotFoundError(absl::StrFormat("address 0x%x is not mapped in this process", at));
  }
  const std::string where = absl::StrFormat("address 0x%x (mapping [0x%x, 0x%x) \"%s\")", at,
                                            found.start, found.end, found.path);
  if (found.inode == 0) {
    return absl::NotFoundError(where + " is anonymous memory; no file backs it");
  }
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (dir == nullptr) return absl::UnavailableError("FindBackingFd: cannot list /proc/self/fd");
  const int dir_fd = dirfd(dir.get());
  while (const dirent* entry = readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dir_fd) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0) continue;
    if (st.st_ino == found.inode && major(st.st_dev) == found.dev_major &&
        minor(st.st_dev) == found.dev_minor) {
      return BackingFd{.fd = static_cast<int>(fd),
                       .offset = found.offset + (at - found.start),
                       .contiguous = found.end - at,
                       .path = found.path};
    }
  }
  return absl::NotFoundError(where + ": no fd of this process is open on its file");
}

absl::StatusOr<MemfdAllocation> AllocateOnMemfd(Transport& transport, uint64_t length) {
  if (length == 0) {
    return absl::InvalidArgumentError("Allocate: length is 0; at least 1 byte is needed");
  }
  KVRAIL_ASSIGN_OR_RETURN(
      Arena arena, Arena::CreateMemfd(
                       absl::StrFormat("kvrail-%s-region", transport.capabilities().name), length));
  auto owned = std::make_unique<Arena>(std::move(arena));
  KVRAIL_ASSIGN_OR_RETURN(RegionId id,
                          transport.Register({.base = owned->data(), .length = length}));
  return MemfdAllocation{.shared = {.region = id,
                                    .base = owned->data(),
                                    .length = length,
                                    .fd = owned->fd(),
                                    .fd_offset = 0,
                                    .placement = "memfd"},
                         .arena = std::move(owned)};
}

}  // namespace kvrail::transport
