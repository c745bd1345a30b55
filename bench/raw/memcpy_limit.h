// The copy limit beside each row: what memcpy moves per second with as many threads as kvrail
// has lanes, in the pieces kvrail writes (a block, or its slices) through the row's working set.
// Over shared memory a put is the posting lane's memcpy, so a transport cannot beat this by much
// (one copy per byte at best, on as many cores); over tcp it bounds each of the copies the kernel
// and UCX make.
#ifndef KVRAIL_BENCH_RAW_MEMCPY_LIMIT_H_
#define KVRAIL_BENCH_RAW_MEMCPY_LIMIT_H_

#include <cstdint>
#include <memory>

#include "absl/time/time.h"

namespace kvrail::bench {

class MemcpyLimit {
 public:
  // Buffers of `max_working_set` bytes each, allocated and touched on first use.
  explicit MemcpyLimit(uint64_t max_working_set);
  ~MemcpyLimit();
  MemcpyLimit(const MemcpyLimit&) = delete;
  MemcpyLimit& operator=(const MemcpyLimit&) = delete;

  // Decimal GB/s of `threads` threads (at least 1) copying for about `duration`: the working set
  // (clamped to [piece_bytes, max_working_set]) of source and destination is cut into `threads`
  // equal parts (64-byte aligned), and each thread copies its own part in pieces of at most
  // `piece_bytes`, round and round. The figure is the sum over threads of each thread's bytes
  // over its own CPU time: what the threads copy when each has a core, however busy the machine
  // (on a shared 2-core machine, wall time made one run of 2 threads read as 1). Measured on
  // every call: a caller keeps the best of a few.
  double Gbps(uint64_t piece_bytes, uint64_t working_set, int threads, absl::Duration duration);

 private:
  uint64_t capacity_;
  uint8_t* source_ = nullptr;
  uint8_t* destination_ = nullptr;
};

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_MEMCPY_LIMIT_H_
