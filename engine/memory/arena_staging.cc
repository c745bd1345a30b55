#include "engine/memory/arena_staging.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvrail {

bool operator==(const ByteRange& a, const ByteRange& b) {
  return a.offset == b.offset && a.length == b.length;
}

std::vector<ByteRange> MergedRanges(const CopyList& copies, CopySide side) {
  std::vector<ByteRange> ranges;
  ranges.reserve(copies.size());
  for (const Copy& copy : copies) {
    if (copy.length == 0) continue;
    ranges.push_back({side == CopySide::kSource ? copy.src_offset : copy.dst_offset, copy.length});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& range : ranges) {
    if (!merged.empty()) {
      ByteRange& last = merged.back();
      const uint64_t last_end = last.offset + last.length;
      if (range.offset <= last_end) {  // overlaps or touches: one range
        last.length = std::max(last_end, range.offset + range.length) - last.offset;
        continue;
      }
    }
    merged.push_back(range);
  }
  return merged;
}

absl::Status CheckRanges(absl::Span<const ByteRange> ranges, uint64_t arena_bytes,
                         const std::string& what) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ByteRange& r = ranges[i];
    if (r.length > arena_bytes || r.offset > arena_bytes - r.length) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": range ", i, " [", r.offset, ", ", r.offset, "+", r.length,
                       ") ends past the arena's ", arena_bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail
