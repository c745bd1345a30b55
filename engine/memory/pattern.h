// A deterministic byte pattern for checking that memory arrived where it should: tests, the
// demo and benchmarks fill a source with it and verify the destination.
#ifndef KVRAIL_ENGINE_MEMORY_PATTERN_H_
#define KVRAIL_ENGINE_MEMORY_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "engine/memory/pattern_byte.h"

namespace kvrail {

// Writes PatternByte(seed, first_offset + i) to out[i] for every i. `first_offset` is the
// absolute offset of out[0] in the buffer the pattern covers, so a slice can be filled or
// checked on its own.
void FillPattern(absl::Span<uint8_t> out, uint64_t seed, uint64_t first_offset = 0);

// The index in `bytes` of the first byte that differs from the pattern FillPattern would write
// with the same arguments, or nullopt when every byte matches.
std::optional<size_t> FirstPatternMismatch(absl::Span<const uint8_t> bytes, uint64_t seed,
                                           uint64_t first_offset = 0);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_PATTERN_H_
