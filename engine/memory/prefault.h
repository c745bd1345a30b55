// Page-table entries made ahead of the stores into a mapping of another process's memory (a
// peer's shared-memory segment that UCX maps here): the first store into each page of such a
// mapping traps and the kernel installs its entry, about 262,000 traps per GiB, inside the
// first room that writes there. madvise(MADV_POPULATE_WRITE) installs the entries of a whole
// chunk in one call, without a trap per page, and leaves the bytes as they are, so it is safe
// on memory the peer writes at the same time (never a read-and-write-back, unlike
// PopulatePages' fallback for old kernels). Each chunk is populated at most once per mapping:
// warm rooms pay a flag test per store. docs/ARCHITECTURE.md, "A peer's segment, mapped once".
#ifndef KVRAIL_ENGINE_MEMORY_PREFAULT_H_
#define KVRAIL_ENGINE_MEMORY_PREFAULT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvrail {

class Prefaulter {
 public:
  static constexpr uint64_t kChunkBytes = uint64_t{2} << 20;

  // For the mapping [base, base + length) (base need not be aligned). An empty Prefaulter
  // (default, or a null base) does nothing.
  Prefaulter() = default;
  Prefaulter(std::byte* base, uint64_t length);

  // Before a store into [at, at + length), inside the mapping: populates each chunk of that
  // range not populated before. Any thread may call it at once with others (two may populate
  // the same chunk; both leave it as it was). A kernel that refuses (before 5.14, or a mapping
  // it cannot populate) turns the Prefaulter off: the stores then fault as they would have.
  void Before(const std::byte* at, uint64_t length);

  // Chunks populated so far (for tests and logs).
  uint64_t chunks_populated() const { return populated_.load(std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

 private:
  uintptr_t begin_ = 0;  // the chunk grid's origin: base rounded down to a page
  uintptr_t end_ = 0;    // base + length
  uint64_t chunks_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> done_;
  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> populated_{0};
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_PREFAULT_H_
