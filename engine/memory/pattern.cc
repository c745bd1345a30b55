#include "engine/memory/pattern.h"

namespace kvrail {

void FillPattern(absl::Span<uint8_t> out, uint64_t seed, uint64_t first_offset) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = PatternByte(seed, first_offset + i);
}

std::optional<size_t> FirstPatternMismatch(absl::Span<const uint8_t> bytes, uint64_t seed,
                                           uint64_t first_offset) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != PatternByte(seed, first_offset + i)) return i;
  }
  return std::nullopt;
}

}  // namespace kvrail
