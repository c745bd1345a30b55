// Helpers behind Transport::Allocate (transport.h): finding the fd that backs a mapping, so a
// backend can hand memory its library allocated to another process, and the memfd placement
// every backend falls back to.
#ifndef KVRAIL_ENGINE_TRANSPORT_SHARED_REGION_H_
#define KVRAIL_ENGINE_TRANSPORT_SHARED_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/memory/arena.h"
#include "engine/transport/transport.h"

namespace kvrail::transport {

// Where the pages at an address live in a file this process holds open.
struct BackingFd {
  int fd = -1;              // one of this process's fds (not duplicated: dup it to keep it)
  uint64_t offset = 0;      // the address's offset in that file
  uint64_t contiguous = 0;  // bytes from the address to the end of its mapping
  std::string path;         // what /proc/self/maps names the file
};

// Finds the mapping that holds `address` in /proc/self/maps and the fd of this process open on
// the same file (same device and inode). NotFound, naming the mapping, when the address is not
// mapped, its mapping is anonymous, or no fd of this process is open on its file (a SysV
// segment, a file already closed).
absl::StatusOr<BackingFd> FindBackingFd(const void* address);

// The memfd placement: a sealed memfd arena of `length` bytes, registered with `transport`.
// The arena must outlive the registration.
struct MemfdAllocation {
  SharedRegion shared;
  std::unique_ptr<Arena> arena;
};
absl::StatusOr<MemfdAllocation> AllocateOnMemfd(Transport& transport, uint64_t length);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_SHARED_REGION_H_
