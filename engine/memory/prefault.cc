#include "engine/memory/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvrail {

Prefaulter::Prefaulter(std::byte* base, uint64_t length) {
  if (base == nullptr || length == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  begin_ = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
  end_ = reinterpret_cast<uintptr_t>(base) + length;
  chunks_ = (end_ - begin_ + kChunkBytes - 1) / kChunkBytes;
  done_ = std::make_unique<std::atomic<uint8_t>[]>(chunks_);
  for (uint64_t i = 0; i < chunks_; ++i) done_[i].store(0, std::memory_order_relaxed);
  enabled_.store(true, std::memory_order_relaxed);
}

void Prefaulter::Before(const std::byte* at, uint64_t length) {
  if (length == 0 || !enabled_.load(std::memory_order_relaxed)) return;
  const uintptr_t first = reinterpret_cast<uintptr_t>(at);
  if (first < begin_ || first >= end_) return;
  const uintptr_t last = std::min<uintptr_t>(first + length, end_) - 1;
  for (uint64_t c = (first - begin_) / kChunkBytes; c <= (last - begin_) / kChunkBytes; ++c) {
    if (done_[c].load(std::memory_order_relaxed) != 0) continue;
    const uintptr_t from = begin_ + c * kChunkBytes;
    const uintptr_t to = std::min<uintptr_t>(from + kChunkBytes, end_);
    if (madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE) != 0) {
      enabled_.store(false, std::memory_order_relaxed);
      return;
    }
    done_[c].store(1, std::memory_order_relaxed);
    populated_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace kvrail
