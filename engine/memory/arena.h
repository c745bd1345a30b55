// Arenas: host memory that a separate engine process can map.
//
// A sidecar and its engine share the KV arena either by name (POSIX shared memory: one side
// creates "/kvrail-p0", the other opens it) or by file descriptor (a memfd whose fd is inherited
// or passed over a Unix socket). Either way both processes map the same pages, and the sidecar
// registers its mapping with the data plane (RecordOf in region.h).
#ifndef KVRAIL_ENGINE_MEMORY_ARENA_H_
#define KVRAIL_ENGINE_MEMORY_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/memory/region.h"

namespace kvrail {

// Longest name after the leading '/' that shm_open accepts (NAME_MAX).
inline constexpr size_t kMaxSharedNameBytes = 255;
// Longest memfd debug name (memfd_create(2)).
inline constexpr size_t kMaxMemfdNameBytes = 249;

// Returns OK when `name` can name a shared-memory arena: a '/', then 1 to 255 printable ASCII
// characters other than '/', and not "/." or "/..". Otherwise InvalidArgument naming the rule.
absl::Status ValidateSharedName(const std::string& name);

// A mapping of host memory, shared with other processes by name or by fd.
//
// Move-only. The destructor unmaps the memory and closes the fd; for an arena made by
// CreateShared it also unlinks the name, unless ReleaseName() was called. The memory stays
// alive while any process still maps it or holds an fd to it.
//
// Thread-compatible: const methods may be called concurrently; the bytes behind data() are
// the caller's to synchronise.
class Arena {
 public:
  // Creates the POSIX shared-memory object `name` with `bytes` bytes, mapped read-write, owner
  // access only (mode 0600), and zero-filled. The memory is reserved up front (posix_fallocate),
  // so a full /dev/shm fails here with ResourceExhausted instead of SIGBUS on first touch.
  // The arena owns the name: its destructor unlinks it (see ReleaseName).
  //
  // Fails with InvalidArgument when `name` breaks ValidateSharedName, when `bytes` is 0 or
  // larger than this machine's physical memory; AlreadyExists when the name is taken
  // (stale names from a crashed process: see UnlinkShared); otherwise the failing call and
  // its errno, e.g. `arena "/kvrail-p0": shm_open failed: Permission denied (errno 13)`.
  // Nothing is left behind on failure.
  static absl::StatusOr<Arena> CreateShared(std::string name, size_t bytes);

  // Maps the existing shared-memory object `name` read-write, at its current size (fstat). The
  // returned arena does not own the name: its destructor never unlinks it.
  //
  // Fails with InvalidArgument for a bad name, NotFound when there is no such object,
  // FailedPrecondition when it is empty (its creator has not sized it yet), otherwise the
  // failing call and its errno.
  static absl::StatusOr<Arena> OpenShared(std::string name);

  // Removes the name `name` (shm_unlink); processes that have it mapped keep their memory.
  // For cleaning up a name left behind by a crashed creator or a released arena. Fails with
  // InvalidArgument for a bad name, NotFound when there is no such object.
  static absl::Status UnlinkShared(const std::string& name);

  // Creates an anonymous arena of `bytes` bytes backed by a memfd (memfd_create(2)), mapped
  // read-write, zero-filled and reserved up front. Its size is sealed (F_SEAL_GROW,
  // F_SEAL_SHRINK): no process holding the fd can truncate it under another's mapping. Share
  // it through fd(): FromFd in a child that inherited it, or SCM_RIGHTS. The fd is
  // close-on-exec. name() is "memfd:<debug_name>".
  //
  // Fails with InvalidArgument when `debug_name` is empty, longer than 249 bytes or holds a
  // byte outside printable ASCII, or for `bytes` as CreateShared; otherwise the failing call
  // and its errno.
  static absl::StatusOr<Arena> CreateMemfd(std::string debug_name, size_t bytes);

  // Maps the memory behind `fd` (a memfd or shared-memory fd, typically received from another
  // process) read-write, at its current size. Duplicates `fd` (close-on-exec); the caller keeps
  // ownership of `fd` and may close it at once. name() is what /proc/self/fd shows for it
  // ("/memfd:kv (deleted)", "/dev/shm/kvrail-p0"), or "fd:<n>".
  //
  // Fails with InvalidArgument when `fd` is negative, not a regular file or shared-memory
  // object, or not open for reading and writing; FailedPrecondition when it is empty;
  // otherwise the failing call and its errno.
  static absl::StatusOr<Arena> FromFd(int fd);

  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // The first byte of the mapping; nullptr only for a moved-from arena.
  uint8_t* data() const { return data_; }
  // The mapping's length in bytes; 0 only for a moved-from arena.
  size_t size() const { return size_; }
  // Always MemoryKind::kHost.
  MemoryKind kind() const { return MemoryKind::kHost; }
  // The shared-memory name, "memfd:<debug_name>", or what FromFd found (see above).
  const std::string& name() const { return name_; }
  // The arena's own fd, open for as long as the arena lives; the caller must not close it.
  // Pass it to another process (inheritance, SCM_RIGHTS), which maps it with FromFd.
  int fd() const { return fd_; }
  // True when the destructor will unlink name() (CreateShared, before ReleaseName).
  bool owns_name() const { return owns_name_; }

  // Gives up ownership of the name: the destructor will still unmap and close, but leave the
  // name for another process to open (and to remove with UnlinkShared). No effect on arenas
  // that do not own a name.
  void ReleaseName() { owns_name_ = false; }

 private:
  Arena(std::string name, int fd, uint8_t* data, size_t size, bool owns_name);
  void Reset();

  std::string name_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owns_name_ = false;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_ARENA_H_
