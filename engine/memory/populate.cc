#include "engine/memory/populate.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvrail {

namespace {

// Whether this kernel knows MADV_POPULATE_WRITE (5.14): EINVAL means either "unknown advice" or
// "this range cannot be populated writable", so a writable page of our own tells them apart.
bool KernelPopulates() {
  static const bool known = [] {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED) return true;  // then the real call reports what is wrong
    const bool ok = madvise(probe, page, MADV_POPULATE_WRITE) == 0;
    munmap(probe, page);
    return ok;
  }();
  return known;
}

}  // namespace

absl::Status PopulatePages(void* base, size_t length) {
  if (base == nullptr) return absl::InvalidArgumentError("PopulatePages: the base is null");
  if (length == 0) return absl::OkStatus();
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(base) + length;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL || KernelPopulates()) {
    const std::string what =
        absl::StrFormat("PopulatePages: madvise(MADV_POPULATE_WRITE) of %d bytes at %#x: %s",
                        end - begin, begin, std::strerror(errno));
    return errno == ENOMEM ? absl::ResourceExhaustedError(what)
                           : absl::FailedPreconditionError(what);
  }
  // A kernel before 5.14: one write per page, of the byte already there (the atomic keeps the
  // compiler from dropping it; nothing else writes these pages yet).
  const uintptr_t first = reinterpret_cast<uintptr_t>(base);
  for (uintptr_t p = begin; p < end; p += page) {
    auto* byte = reinterpret_cast<std::atomic<uint8_t>*>(p < first ? first : p);
    byte->store(byte->load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

}  // namespace kvrail
