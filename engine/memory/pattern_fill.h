// The CUDA pattern kernel's host entry point, compiled by nvcc (pattern_fill.cu). Internal to
// CudaArena::FillPattern; exists only when KVRAIL_HAVE_CUDA is 1. Plain types only: nvcc does
// not see absl.
#ifndef KVRAIL_ENGINE_MEMORY_PATTERN_FILL_H_
#define KVRAIL_ENGINE_MEMORY_PATTERN_FILL_H_

#include <cstdint>

namespace kvrail {

// Writes PatternByte(seed, first_offset + i) to device_data[i] for i < bytes, on the current
// device's default stream, and waits for it. Returns the cudaError_t of the launch or the wait
// (0 is cudaSuccess).
int LaunchPatternFill(void* device_data, uint64_t bytes, uint64_t seed, uint64_t first_offset);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_PATTERN_FILL_H_
