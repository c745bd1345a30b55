// The byte of kvrail's test pattern at one offset: shared by host code and CUDA kernels, so it
// depends on nothing (no absl, no std beyond <cstdint>).
#ifndef KVRAIL_ENGINE_MEMORY_PATTERN_BYTE_H_
#define KVRAIL_ENGINE_MEMORY_PATTERN_BYTE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KVRAIL_HOST_DEVICE __host__ __device__
#else
#define KVRAIL_HOST_DEVICE
#endif

namespace kvrail {

// The byte at absolute offset `offset` of a buffer filled with pattern `seed`. A mixing function
// of both (splitmix64's finaliser), so a byte copied to the wrong offset, or left over from
// another seed, almost never matches.
KVRAIL_HOST_DEVICE inline uint8_t PatternByte(uint64_t seed, uint64_t offset) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + offset;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint8_t>(x ^ (x >> 31));
}

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_PATTERN_BYTE_H_
