// ArenaStaging (arena_staging.h) between two host buffers with memcpy: the sidecar's
// --emulate-gpu-arena treats an engine's shared-memory arena as memory its data plane cannot
// reach and stages it through a mirror as it would GPU memory, so that every line of the
// staging path except the CUDA copies runs (and is tested) where no GPU is. Those copies are
// CudaArenaStaging's, tested on a lent GPU (cuda_staging_test, bench/gpu/check).
#ifndef KVRAIL_ENGINE_MEMORY_HOST_ARENA_STAGING_H_
#define KVRAIL_ENGINE_MEMORY_HOST_ARENA_STAGING_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "engine/memory/arena_staging.h"

namespace kvrail {

class HostArenaStaging : public ArenaStaging {
 public:
  // `arena` and `mirror` hold `bytes` each and outlive this object.
  HostArenaStaging(uint8_t* arena, uint8_t* mirror, uint64_t bytes);

  // Calls are serialised, as CudaArenaStaging's are (its chunks and stream are shared): two
  // destinations of one room may stage the same source bytes from two threads.
  absl::Status ToMirror(absl::Span<const ByteRange> ranges) override;
  absl::Status FromMirror(absl::Span<const ByteRange> ranges) override;
  uint64_t bytes() const override { return bytes_; }
  std::string Describe() const override;

 private:
  uint8_t* const arena_;
  uint8_t* const mirror_;
  const uint64_t bytes_;
  std::mutex mu_;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_HOST_ARENA_STAGING_H_
