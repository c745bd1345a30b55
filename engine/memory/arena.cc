#include "engine/memory/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

namespace kvrail {
namespace {

// Names in messages: escaped to stay on one line, and cut short past 80 bytes.
std::string Quoted(absl::string_view text) {
  constexpr size_t kShown = 80;
  if (text.size() <= kShown) return absl::StrCat("\"", absl::CEscape(text), "\"");
  return absl::StrCat("\"", absl::CEscape(text.substr(0, kShown)), "\"... (", text.size(),
                      " bytes)");
}

std::string ErrnoText(int error) {
  char buffer[128];
  // GNU strerror_r: returns a static string or one written into `buffer`.
  return strerror_r(error, buffer, sizeof(buffer));
}

// "<subject>: <call> failed: <strerror> (errno N)", with the absl code that matches errno.
absl::Status ErrnoError(int error, absl::string_view subject, absl::string_view call) {
  return absl::Status(
      absl::ErrnoToStatusCode(error),
      absl::StrCat(subject, ": ", call, " failed: ", ErrnoText(error), " (errno ", error, ")"));
}

size_t PhysicalMemoryBytes() {
  const int64_t pages = sysconf(_SC_PHYS_PAGES);
  const int64_t page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return SIZE_MAX;  // unknown: only the 0 check applies
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size);
}

absl::Status CheckSize(absl::string_view subject, size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": size 0: an arena holds at least one byte"));
  }
  const size_t limit = PhysicalMemoryBytes();
  if (bytes > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": size ", bytes, " bytes exceeds this machine's physical memory (",
                     limit, " bytes)"));
  }
  return absl::OkStatus();
}

// Sizes a fresh object to `bytes` and reserves its pages, so that running out of tmpfs space
// fails here (ENOSPC) rather than as SIGBUS when a page is first touched.
absl::Status SizeAndReserve(int fd, size_t bytes, absl::string_view subject) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return ErrnoError(errno, subject, absl::StrCat("ftruncate to ", bytes, " bytes"));
  }
  int error;
  do {
    error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (error == EINTR);
  if (error != 0) {
    return ErrnoError(error, subject, absl::StrCat("posix_fallocate of ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> MapShared(int fd, size_t bytes, absl::string_view subject) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return ErrnoError(errno, subject, absl::StrCat("mmap of ", bytes, " bytes"));
  }
  return static_cast<uint8_t*>(data);
}

// The size of an existing object, which must be non-empty.
absl::StatusOr<size_t> ExistingSize(int fd, absl::string_view subject) {
  struct stat info;
  if (fstat(fd, &info) != 0) return ErrnoError(errno, subject, "fstat");
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        subject, ": not a regular file or shared-memory object (mode ",
        absl::StrFormat("%#o", info.st_mode & S_IFMT), "), so it cannot back an arena"));
  }
  if (info.st_size == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(subject, ": size 0: the object is empty (has its creator sized it yet?)"));
  }
  return static_cast<size_t>(info.st_size);
}

}  // namespace

absl::Status ValidateSharedName(const std::string& name) {
  const std::string subject = absl::StrCat("arena name ", Quoted(name));
  if (name.empty() || name[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": must start with '/' (shm_overview(7))"));
  }
  if (name.size() == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": needs at least one character after the leading '/'"));
  }
  if (name.size() - 1 > kMaxSharedNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": ", name.size() - 1,
                                                   " characters after the '/' exceed the limit of ",
                                                   kMaxSharedNameBytes, " (NAME_MAX)"));
  }
  for (size_t i = 1; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c == '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(subject, ": '/' at position ", i, "; only the first character may be '/'"));
    }
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          subject, ": byte ", i, absl::StrFormat(" (0x%02x)", c), " is not printable ASCII"));
    }
  }
  if (name == "/." || name == "/..") {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": \".\" and \"..\" cannot name a shared-memory object"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Arena> Arena::CreateShared(std::string name, size_t bytes) {
  KVRAIL_RETURN_IF_ERROR(ValidateSharedName(name));
  const std::string subject = absl::StrCat("arena ", Quoted(name));
  KVRAIL_RETURN_IF_ERROR(CheckSize(subject, bytes));

  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
  if (fd < 0) return ErrnoError(errno, subject, "shm_open");
  // From here on, a failure removes what it made.
  auto undo = [&](absl::Status status) {
    close(fd);
    shm_unlink(name.c_str());
    return status;
  };
  if (absl::Status s = SizeAndReserve(fd, bytes, subject); !s.ok()) return undo(s);
  absl::StatusOr<uint8_t*> data = MapShared(fd, bytes, subject);
  if (!data.ok()) return undo(data.status());
  return Arena(std::move(name), fd, *data, bytes, /*owns_name=*/true);
}

absl::StatusOr<Arena> Arena::OpenShared(std::string name) {
  KVRAIL_RETURN_IF_ERROR(ValidateSharedName(name));
  const std::string subject = absl::StrCat("arena ", Quoted(name));
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return ErrnoError(errno, subject, "shm_open");
  absl::StatusOr<size_t> bytes = ExistingSize(fd, subject);
  if (!bytes.ok()) {
    close(fd);
    return bytes.status();
  }
  absl::StatusOr<uint8_t*> data = MapShared(fd, *bytes, subject);
  if (!data.ok()) {
    close(fd);
    return data.status();
  }
  return Arena(std::move(name), fd, *data, *bytes, /*owns_name=*/false);
}

absl::Status Arena::UnlinkShared(const std::string& name) {
  KVRAIL_RETURN_IF_ERROR(ValidateSharedName(name));
  if (shm_unlink(name.c_str()) != 0) {
    return ErrnoError(errno, absl::StrCat("arena ", Quoted(name)), "shm_unlink");
  }
  return absl::OkStatus();
}

absl::StatusOr<Arena> Arena::CreateMemfd(std::string debug_name, size_t bytes) {
  const std::string subject = absl::StrCat("memfd arena ", Quoted(debug_name));
  if (debug_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject,
                     ": the debug name must not be empty (it names the arena in "
                     "messages and in /proc/<pid>/maps)"));
  }
  if (debug_name.size() > kMaxMemfdNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": ", debug_name.size(),
                                                   " bytes exceed the debug name limit of ",
                                                   kMaxMemfdNameBytes, " (memfd_create(2))"));
  }
  for (size_t i = 0; i < debug_name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(debug_name[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          subject, ": byte ", i, absl::StrFormat(" (0x%02x)", c), " is not printable ASCII"));
    }
  }
  KVRAIL_RETURN_IF_ERROR(CheckSize(subject, bytes));

  const int fd = memfd_create(debug_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoError(errno, subject, "memfd_create");
  auto undo = [&](absl::Status status) {
    close(fd);
    return status;
  };
  if (absl::Status s = SizeAndReserve(fd, bytes, subject); !s.ok()) return undo(s);
  // A peer that holds the fd must not be able to shrink the file under our mapping (SIGBUS).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return undo(ErrnoError(errno, subject, "fcntl(F_ADD_SEALS)"));
  }
  absl::StatusOr<uint8_t*> data = MapShared(fd, bytes, subject);
  if (!data.ok()) return undo(data.status());
  return Arena(absl::StrCat("memfd:", debug_name), fd, *data, bytes, /*owns_name=*/false);
}

absl::StatusOr<Arena> Arena::FromFd(int fd) {
  std::string subject = absl::StrCat("arena from fd ", fd);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": not a file descriptor"));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoError(errno, subject, "fcntl(F_GETFL)");
  if ((flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(absl::StrCat(
        subject, ": not open for reading and writing; an arena maps its memory read-write"));
  }
  std::string name = absl::StrCat("fd:", fd);
  char link[512];
  const ssize_t length =
      readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), link, sizeof(link) - 1);
  if (length > 0) {
    name.assign(link, static_cast<size_t>(length));
    subject = absl::StrCat("arena from fd ", fd, " (", Quoted(name), ")");
  }
  KVRAIL_ASSIGN_OR_RETURN(const size_t bytes, ExistingSize(fd, subject));

  const int own_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own_fd < 0) return ErrnoError(errno, subject, "fcntl(F_DUPFD_CLOEXEC)");
  absl::StatusOr<uint8_t*> data = MapShared(own_fd, bytes, subject);
  if (!data.ok()) {
    close(own_fd);
    return data.status();
  }
  return Arena(std::move(name), own_fd, *data, bytes, /*owns_name=*/false);
}

Arena::Arena(std::string name, int fd, uint8_t* data, size_t size, bool owns_name)
    : name_(std::move(name)), fd_(fd), data_(data), size_(size), owns_name_(owns_name) {}

Arena::Arena(Arena&& other) noexcept
    : name_(std::move(other.name_)),
      fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owns_name_(std::exchange(other.owns_name_, false)) {
  other.name_.clear();
}

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    other.name_.clear();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

Arena::~Arena() { Reset(); }

void Arena::Reset() {
  // Errors are ignored: nothing useful can be done about them in a destructor.
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  if (owns_name_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  owns_name_ = false;
}

}  // namespace kvrail
