#include "bench/raw/memcpy_limit.h"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint8_t* Map(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0x5a, bytes);
  return static_cast<uint8_t*>(p);
}

// This thread's CPU time: a thread a neighbour's process kept off its core for a while copied
// nothing in that while, and is not charged for it.
double ThreadCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

struct Part {
  uint8_t* destination;
  const uint8_t* source;
  uint64_t length;
  uint64_t piece;
  uint64_t bytes = 0;  // copied in the measured time
  double seconds = 0;  // the thread's CPU time in it
};

// One thread's loop: one unmeasured pass (brings its part into whatever cache holds it), a
// wait until every thread has made its pass, then pieces round and round until the deadline.
void CopyPart(Part& part, std::atomic<int>& ready, int threads, absl::Duration duration) {
  for (uint64_t at = 0; at < part.length; at += part.piece) {
    std::memcpy(part.destination + at, part.source + at, std::min(part.piece, part.length - at));
  }
  ready.fetch_add(1, std::memory_order_acq_rel);
  while (ready.load(std::memory_order_acquire) < threads) std::this_thread::yield();
  const double cpu_start = ThreadCpuSeconds();
  const auto start = Clock::now();
  const auto deadline = start + absl::ToChronoNanoseconds(duration);
  // The clock is read once per kClockBytes copied, not per piece: at 4 KiB a read per piece
  // cost as much as the copy, and the "limit" fell below ucx_perftest's puts.
  constexpr uint64_t kClockBytes = uint64_t{1} << 20;
  uint64_t at = 0;
  uint64_t since_clock = 0;
  auto now = start;
  do {
    const uint64_t n = std::min(part.piece, part.length - at);
    std::memcpy(part.destination + at, part.source + at, n);
    part.bytes += n;
    at = at + n == part.length ? 0 : at + n;
    since_clock += n;
    if (since_clock >= kClockBytes) {
      since_clock = 0;
      now = Clock::now();
    }
  } while (now < deadline);
  part.seconds = ThreadCpuSeconds() - cpu_start;
}

}  // namespace

MemcpyLimit::MemcpyLimit(uint64_t max_working_set) : capacity_(max_working_set) {}

MemcpyLimit::~MemcpyLimit() {
  if (source_ != nullptr) munmap(source_, capacity_);
  if (destination_ != nullptr) munmap(destination_, capacity_);
}

double MemcpyLimit::Gbps(uint64_t piece_bytes, uint64_t working_set, int threads,
                         absl::Duration duration) {
  threads = std::max(1, threads);
  working_set = std::clamp(working_set, piece_bytes, std::max(capacity_, piece_bytes));
  if (source_ == nullptr) {
    capacity_ = std::max(capacity_, piece_bytes);
    source_ = Map(capacity_);
    destination_ = Map(capacity_);
    if (source_ == nullptr || destination_ == nullptr) return 0;
  }
  // Equal parts, 64-byte aligned (the last takes the rest); a part is never empty.
  const uint64_t share = std::max<uint64_t>(64, working_set / threads / 64 * 64);
  std::vector<Part> parts;
  for (uint64_t at = 0; at < working_set && static_cast<int>(parts.size()) < threads; at += share) {
    const bool last = static_cast<int>(parts.size()) + 1 == threads || at + share >= working_set;
    const uint64_t length = last ? working_set - at : share;
    parts.push_back(Part{destination_ + at, source_ + at, length, std::min(piece_bytes, length)});
  }
  const int running = static_cast<int>(parts.size());
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int i = 1; i < running; ++i) {
    workers.emplace_back([&, i] { CopyPart(parts[i], ready, running, duration); });
  }
  CopyPart(parts[0], ready, running, duration);
  for (std::thread& worker : workers) worker.join();
  double bytes_per_s = 0;
  for (const Part& part : parts) {
    if (part.seconds > 0) bytes_per_s += static_cast<double>(part.bytes) / part.seconds;
  }
  return bytes_per_s / 1e9;
}

}  // namespace kvrail::bench
