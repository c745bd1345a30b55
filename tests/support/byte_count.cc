#include "tests/support/byte_count.h"

#include <algorithm>
#include <cstring>

namespace kvrail::testing {
namespace {

constexpr size_t kChunk = 64 * 1024;

// Nonzero bytes of x: each byte folded onto its low bit, then counted.
int NonzeroBytes(uint64_t x) {
  x |= x >> 4;
  x |= x >> 2;
  x |= x >> 1;
  return __builtin_popcountll(x & 0x0101010101010101ull);
}

uint64_t CountDiffering(const uint8_t* a, const uint8_t* b, size_t n) {
  uint64_t count = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    count += NonzeroBytes(x ^ y);
  }
  for (; i < n; ++i) count += a[i] != b[i];
  return count;
}

}  // namespace

uint64_t CountBytesNot(const uint8_t* p, size_t n, uint8_t value) {
  uint8_t pattern[kChunk];
  std::memset(pattern, value, sizeof pattern);
  uint64_t count = 0;
  for (size_t at = 0; at < n; at += kChunk) {
    const size_t len = std::min(kChunk, n - at);
    if (std::memcmp(p + at, pattern, len) != 0) count += CountDiffering(p + at, pattern, len);
  }
  return count;
}

uint64_t CountBytesDiffering(const uint8_t* a, const uint8_t* b, size_t n) {
  uint64_t count = 0;
  for (size_t at = 0; at < n; at += kChunk) {
    const size_t len = std::min(kChunk, n - at);
    if (std::memcmp(a + at, b + at, len) != 0) count += CountDiffering(a + at, b + at, len);
  }
  return count;
}

}  // namespace kvrail::testing
