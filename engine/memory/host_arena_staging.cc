#include "engine/memory/host_arena_staging.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail {

HostArenaStaging::HostArenaStaging(uint8_t* arena, uint8_t* mirror, uint64_t bytes)
    : arena_(arena), mirror_(mirror), bytes_(bytes) {}

absl::Status HostArenaStaging::ToMirror(absl::Span<const ByteRange> ranges) {
  KVRAIL_RETURN_IF_ERROR(CheckRanges(ranges, bytes_, "staging to the mirror"));
  std::lock_guard<std::mutex> lock(mu_);
  for (const ByteRange& r : ranges) {
    for (uint64_t row = 0, at = r.offset; row < r.rows; ++row, at += r.stride) {
      std::memcpy(mirror_ + at, arena_ + at, r.length);
    }
  }
  return absl::OkStatus();
}

absl::Status HostArenaStaging::FromMirror(absl::Span<const ByteRange> ranges) {
  KVRAIL_RETURN_IF_ERROR(CheckRanges(ranges, bytes_, "staging from the mirror"));
  std::lock_guard<std::mutex> lock(mu_);
  for (const ByteRange& r : ranges) {
    for (uint64_t row = 0, at = r.offset; row < r.rows; ++row, at += r.stride) {
      std::memcpy(arena_ + at, mirror_ + at, r.length);
    }
  }
  return absl::OkStatus();
}

std::string HostArenaStaging::Describe() const {
  return absl::StrCat("host staging (--emulate-gpu-arena): ", bytes_,
                      " bytes through a host mirror with memcpy");
}

}  // namespace kvrail
