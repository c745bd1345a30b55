#include "engine/memory/pattern.h"

#include <cstring>

#include "absl/base/config.h"

#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "PatternWord assumes a little-endian host"
#endif

namespace kvrail {
namespace {

// The pattern's next 8 bytes from `offset`, in memory order (the byte at `offset` first).
uint64_t PatternWord(uint64_t seed, uint64_t offset) {
  uint64_t word = 0;
  for (int b = 0; b < 8; ++b) word |= uint64_t{PatternByte(seed, offset + b)} << (8 * b);
  return word;  // little-endian: byte b in memory is bits 8b to 8b+7
}

}  // namespace

// Both loops move 8 bytes per access through a raw pointer. The sanitizers check each access,
// so a byte-wise loop paid 8 checks per word; and under UBSan, clang calls Span::operator[] out
// of line for every byte even at -O2 (BUILD.bazel compiles this file at -O2 in every
// configuration: these loops touch every byte a process test moves).
void FillPattern(absl::Span<uint8_t> out, uint64_t seed, uint64_t first_offset) {
  uint8_t* const data = out.data();
  const size_t size = out.size();
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t word = PatternWord(seed, first_offset + i);
    std::memcpy(data + i, &word, sizeof(word));
  }
  for (; i < size; ++i) data[i] = PatternByte(seed, first_offset + i);
}

std::optional<size_t> FirstPatternMismatch(absl::Span<const uint8_t> bytes, uint64_t seed,
                                           uint64_t first_offset) {
  const uint8_t* const data = bytes.data();
  const size_t size = bytes.size();
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, sizeof(word));
    if (word != PatternWord(seed, first_offset + i)) break;  // the byte is found below
  }
  for (; i < size; ++i) {
    if (data[i] != PatternByte(seed, first_offset + i)) return i;
  }
  return std::nullopt;
}

}  // namespace kvrail
