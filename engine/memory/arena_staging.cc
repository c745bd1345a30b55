#include "engine/memory/arena_staging.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvrail {

bool operator==(const ByteRange& a, const ByteRange& b) {
  return a.offset == b.offset && a.length == b.length && a.rows == b.rows &&
         (a.rows <= 1 || a.stride == b.stride);
}

std::vector<ByteRange> MergedRanges(const CopyList& copies, CopySide side) {
  std::vector<ByteRange> ranges;
  ranges.reserve(copies.size());
  for (const Copy& copy : copies) {
    if (copy.length == 0 || copy.rows == 0) continue;
    const uint64_t offset = side == CopySide::kSource ? copy.src_offset : copy.dst_offset;
    const uint64_t stride = side == CopySide::kSource ? copy.src_stride : copy.dst_stride;
    if (copy.rows > 1 && stride != copy.length) {
      ranges.push_back({offset, copy.length, copy.rows, stride});
    } else {
      ranges.push_back({offset, PayloadBytes(copy)});  // one row, or rows back to back
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& range : ranges) {
    if (!merged.empty() && range.rows == 1 && merged.back().rows == 1) {
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
    if (r.rows > 1 && r.stride < r.length) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": range ", i, " has ", r.rows,
                                                     " rows of ", r.length, " bytes ", r.stride,
                                                     " apart: rows must not overlap"));
    }
    // The span, (rows - 1) * stride + length, unless it overflows.
    const bool overflows = r.rows > 1 && (r.rows - 1 > (UINT64_MAX - r.length) / r.stride);
    const uint64_t span = overflows ? UINT64_MAX : RangeSpan(r);
    if (overflows || span > arena_bytes || r.offset > arena_bytes - span) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": range ", i, " [", r.offset, ", ", r.offset, "+",
                       overflows ? std::string("overflow") : absl::StrCat(span),
                       ") ends past the arena's ", arena_bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail
