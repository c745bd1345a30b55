#include <cuda_runtime_api.h>

#include "engine/memory/pattern_byte.h"
#include "engine/memory/pattern_fill.h"

namespace kvrail {
namespace {

// Eight bytes per thread per step, grid-strided, so one launch covers any size.
__global__ void PatternFillKernel(uint8_t* data, uint64_t bytes, uint64_t seed,
                                  uint64_t first_offset) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x * 8;
  for (uint64_t start = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
       start < bytes; start += stride) {
    const uint64_t end = start + 8 < bytes ? start + 8 : bytes;
    for (uint64_t i = start; i < end; ++i) data[i] = PatternByte(seed, first_offset + i);
  }
}

}  // namespace

int LaunchPatternFill(void* device_data, uint64_t bytes, uint64_t seed, uint64_t first_offset) {
  if (bytes == 0) return cudaSuccess;
  constexpr unsigned kThreads = 256;
  const uint64_t wanted = (bytes + kThreads * 8 - 1) / (kThreads * 8);
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  PatternFillKernel<<<blocks, kThreads>>>(static_cast<uint8_t*>(device_data), bytes, seed,
                                          first_offset);
  const cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) return launched;
  return cudaStreamSynchronize(0);
}

}  // namespace kvrail
