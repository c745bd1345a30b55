// ArenaStaging (arena_staging.h) for a CUDA arena: CudaStaging's pinned chunks and stream
// (cuda_staging.h) between the GPU arena and its host mirror. To the mirror, each range is
// copied device to pinned chunk with cudaMemcpyAsync, `depth` chunks in flight, and each chunk
// is copied on to the mirror while later chunks copy; from the mirror, the ranges are packed
// into chunks and copied host to device, and the call returns once the stream is done. A range
// of rows (a head-sliced page, issue 31) crosses the bus as its rows alone, packed: one
// cudaMemcpy2DAsync per chunk each way (CudaStaging::StageOutRows, a Scatter of rows).
//
// Built with or without a toolkit: without one, Create returns CudaStaging::Create's
// Unimplemented; without a GPU, its "no GPU" line.
#ifndef KVRAIL_ENGINE_MEMORY_CUDA_ARENA_STAGING_H_
#define KVRAIL_ENGINE_MEMORY_CUDA_ARENA_STAGING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/memory/arena_staging.h"
#include "engine/memory/cuda_staging.h"

namespace kvrail {

class CudaArenaStaging : public ArenaStaging {
 public:
  // `device_arena` (GPU memory on options.device) and `mirror` (host memory) hold `bytes` each
  // and outlive the object. Fails as CudaStaging::Create does.
  static absl::StatusOr<std::unique_ptr<CudaArenaStaging>> Create(uint8_t* device_arena,
                                                                  uint8_t* mirror, uint64_t bytes,
                                                                  const StagingOptions& options);

  // Serialised by CudaStaging's own mutex.
  absl::Status ToMirror(absl::Span<const ByteRange> ranges) override;
  absl::Status FromMirror(absl::Span<const ByteRange> ranges) override;
  uint64_t bytes() const override { return bytes_; }
  std::string Describe() const override;

 private:
  CudaArenaStaging(std::unique_ptr<CudaStaging> staging, uint8_t* device_arena, uint8_t* mirror,
                   uint64_t bytes);

  const std::unique_ptr<CudaStaging> staging_;
  uint8_t* const device_;
  uint8_t* const mirror_;
  const uint64_t bytes_;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_CUDA_ARENA_STAGING_H_
