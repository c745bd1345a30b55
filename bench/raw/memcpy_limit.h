// The single-thread memcpy limit beside each row: what one core copies per second with the same
// block size and working set as the row's writes. Over shared memory a transport cannot beat
// it by much (one copy per byte at best); over tcp it bounds each of the copies the kernel and
// UCX make.
#ifndef KVRAIL_BENCH_RAW_MEMCPY_LIMIT_H_
#define KVRAIL_BENCH_RAW_MEMCPY_LIMIT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "absl/time/time.h"

namespace kvrail::bench {

class MemcpyLimit {
 public:
  // Buffers of `max_working_set` bytes each, allocated and touched on first use.
  explicit MemcpyLimit(uint64_t max_working_set);
  ~MemcpyLimit();
  MemcpyLimit(const MemcpyLimit&) = delete;
  MemcpyLimit& operator=(const MemcpyLimit&) = delete;

  // Decimal GB/s of memcpy in `block_bytes` pieces cycling through `working_set` bytes (clamped
  // to [block_bytes, max_working_set]) of source and destination, for about `duration`. Cached
  // per (block, working set).
  double Gbps(uint64_t block_bytes, uint64_t working_set, absl::Duration duration);

 private:
  uint64_t capacity_;
  uint8_t* source_ = nullptr;
  uint8_t* destination_ = nullptr;
  std::map<std::pair<uint64_t, uint64_t>, double> cache_;
};

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_MEMCPY_LIMIT_H_
