#include "engine/memory/cuda_arena_staging.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail {

absl::StatusOr<std::unique_ptr<CudaArenaStaging>> CudaArenaStaging::Create(
    uint8_t* device_arena, uint8_t* mirror, uint64_t bytes, const StagingOptions& options) {
  if (device_arena == nullptr || mirror == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        "CUDA arena staging: the arena, the mirror and their size must be given");
  }
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<CudaStaging> staging, CudaStaging::Create(options));
  return std::unique_ptr<CudaArenaStaging>(
      new CudaArenaStaging(std::move(staging), device_arena, mirror, bytes));
}

CudaArenaStaging::CudaArenaStaging(std::unique_ptr<CudaStaging> staging, uint8_t* device_arena,
                                   uint8_t* mirror, uint64_t bytes)
    : staging_(std::move(staging)), device_(device_arena), mirror_(mirror), bytes_(bytes) {}

absl::Status CudaArenaStaging::ToMirror(absl::Span<const ByteRange> ranges) {
  KVRAIL_RETURN_IF_ERROR(CheckRanges(ranges, bytes_, "staging to the mirror"));
  for (const ByteRange& r : ranges) {
    if (r.length == 0 || r.rows == 0) continue;
    if (r.rows > 1 && r.length <= staging_->chunk_bytes()) {
      // A head-sliced page's rows: packed into the chunks by one 2-D copy each, then each row to
      // its place in the mirror.
      uint8_t* const to = mirror_ + r.offset;
      KVRAIL_RETURN_IF_ERROR(staging_->StageOutRows(
          device_ + r.offset, r.length, r.rows, r.stride,
          [&r, to](const uint8_t* host, uint64_t first, uint64_t count) -> absl::Status {
            for (uint64_t row = 0; row < count; ++row) {
              std::memcpy(to + (first + row) * r.stride, host + row * r.length, r.length);
            }
            return absl::OkStatus();
          }));
      continue;
    }
    for (uint64_t row = 0; row < r.rows; ++row) {  // one range, or rows longer than a chunk
      uint8_t* const to = mirror_ + r.offset + row * r.stride;
      KVRAIL_RETURN_IF_ERROR(staging_->StageOut(
          device_ + r.offset + row * r.stride, r.length,
          [to](const uint8_t* host, uint64_t offset, uint64_t length) -> absl::Status {
            std::memcpy(to + offset, host, length);
            return absl::OkStatus();
          }));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaArenaStaging::FromMirror(absl::Span<const ByteRange> ranges) {
  KVRAIL_RETURN_IF_ERROR(CheckRanges(ranges, bytes_, "staging from the mirror"));
  std::vector<CudaStaging::Scatter> scatters;
  scatters.reserve(ranges.size());
  for (const ByteRange& r : ranges) {
    if (r.length == 0 || r.rows == 0) continue;
    scatters.push_back({mirror_ + r.offset, device_ + r.offset, r.length, r.rows, r.stride,
                        r.stride});  // the mirror has the arena's layout: one pitch
  }
  if (scatters.empty()) return absl::OkStatus();
  return staging_->ScatterIn(scatters);
}

std::string CudaArenaStaging::Describe() const {
  return absl::StrCat("CUDA staging on device ", staging_->device(), ": ", staging_->depth(),
                      " chunks of ", staging_->chunk_bytes(), " pinned bytes, ", bytes_,
                      " bytes mirrored in host memory");
}

}  // namespace kvrail
