#include "bench/raw/memcpy_limit.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "absl/time/time.h"

namespace kvrail::bench {
namespace {

uint8_t* Map(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0x5a, bytes);
  return static_cast<uint8_t*>(p);
}

}  // namespace

MemcpyLimit::MemcpyLimit(uint64_t max_working_set) : capacity_(max_working_set) {}

MemcpyLimit::~MemcpyLimit() {
  if (source_ != nullptr) munmap(source_, capacity_);
  if (destination_ != nullptr) munmap(destination_, capacity_);
}

double MemcpyLimit::Gbps(uint64_t block_bytes, uint64_t working_set, absl::Duration duration) {
  working_set = std::clamp(working_set, block_bytes, std::max(capacity_, block_bytes));
  const auto key = std::make_pair(block_bytes, working_set);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  if (source_ == nullptr) {
    capacity_ = std::max(capacity_, block_bytes);
    source_ = Map(capacity_);
    destination_ = Map(capacity_);
    if (source_ == nullptr || destination_ == nullptr) return 0;
  }
  const uint64_t slots = std::max<uint64_t>(1, working_set / block_bytes);
  using Clock = std::chrono::steady_clock;
  // One unmeasured pass brings the working set into whatever cache holds it.
  for (uint64_t s = 0; s < slots; ++s) {
    std::memcpy(destination_ + s * block_bytes, source_ + s * block_bytes, block_bytes);
  }
  const auto start = Clock::now();
  const auto deadline = start + absl::ToChronoNanoseconds(duration);
  uint64_t bytes = 0;
  uint64_t slot = 0;
  auto now = start;
  do {
    std::memcpy(destination_ + slot * block_bytes, source_ + slot * block_bytes, block_bytes);
    bytes += block_bytes;
    slot = slot + 1 == slots ? 0 : slot + 1;
    now = Clock::now();
  } while (now < deadline);
  const double seconds = std::chrono::duration<double>(now - start).count();
  const double gbps = static_cast<double>(bytes) / seconds / 1e9;
  cache_[key] = gbps;
  return gbps;
}

}  // namespace kvrail::bench
