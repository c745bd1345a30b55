// Registration records: the base, length and memory kind of every region a sidecar registers
// with its data plane and announces to its peers in the data-plane handshake.
//
// "Bounds before bytes" (ARCHITECTURE.md): every destination range is checked with Contains()
// against the regions the decode registered before any write is posted.
#ifndef KVRAIL_ENGINE_MEMORY_REGION_H_
#define KVRAIL_ENGINE_MEMORY_REGION_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kvrail {

class Arena;

// Where a region's bytes live.
enum class MemoryKind {
  kHost,  // CPU memory (named shared memory or memfd)
  kCuda,  // GPU memory (cudaMalloc, or imported through CUDA IPC)
};

// The stable name of a kind: "host" or "cuda".
absl::string_view MemoryKindName(MemoryKind kind);

// One registered region: the bytes [base, base + length) in the owning process's address space
// (a device address for kCuda).
struct RegionRecord {
  uint64_t base = 0;
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  std::string name;  // for messages: the arena's name ("/kvrail-p0", "memfd:kv", ...)

  bool operator==(const RegionRecord& other) const;
  bool operator!=(const RegionRecord& other) const { return !(*this == other); }
};

// The record of `arena`'s mapping in this process. The base is only meaningful in this process.
RegionRecord RecordOf(const Arena& arena);

// True when [address, address + length) lies within [region.base, region.base + region.length).
// Never overflows: a range whose last byte would lie past 2^64 - 1 (address + length wraps) is
// not contained. A range may end exactly at the region's end. A zero-length range is contained
// when `address` lies in [base, base + length].
bool Contains(const RegionRecord& region, uint64_t address, uint64_t length);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_REGION_H_
