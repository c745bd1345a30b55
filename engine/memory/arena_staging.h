// An arena the data plane cannot reach, moved through a host mirror that it can (issue 14,
// point 4): GPU memory over a transport without GPUDirect (UCX 1.13 here, any transport whose
// Capabilities::gpu_memory is false). The mirror has the arena's size and layout, so an offset
// means the same bytes in both: the prefill copies a room's source ranges to the mirror before
// its writes read them, and the decode copies the ranges a prefill rank landed in the mirror back
// to the arena before that rank's Success counts (control/sidecar/arena_staging.cc).
//
// Implementations: CudaArenaStaging (cuda_arena_staging.h: pinned chunks and cudaMemcpyAsync on a
// stream of its own) and HostArenaStaging (host_arena_staging.h: memcpy, for a host arena that a
// test treats as unreachable, so that the sidecar's staging path runs where no GPU is).
#ifndef KVRAIL_ENGINE_MEMORY_ARENA_STAGING_H_
#define KVRAIL_ENGINE_MEMORY_ARENA_STAGING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/base/copy_list.h"

namespace kvrail {

// `length` bytes at `offset`, in the arena and in its mirror alike; with `rows` > 1, that many
// rows of `length` bytes, row r at `offset` + r * `stride` (a head-sliced page's rows on one
// side of a strided copy, engine/base/copy_list.h), `stride` at least `length`.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t rows = 1;
  uint64_t stride = 0;
};

// Equal when they name the same bytes the same way: the stride counts only with rows > 1.
bool operator==(const ByteRange& a, const ByteRange& b);
// The bytes a range names (rows x length) and the span from its first byte to its last.
inline uint64_t RangeBytes(const ByteRange& r) { return r.rows * r.length; }
inline uint64_t RangeSpan(const ByteRange& r) { return (r.rows - 1) * r.stride + r.length; }

// Which offsets of a copy list a range list is made of: the source's (a prefill's arena) or the
// destination's (a decode's).
enum class CopySide { kSource, kDestination };

// The byte ranges that `copies` read (kSource) or write (kDestination), sorted by offset, empty
// copies left out. A strided copy whose rows are apart on that side is one range of its rows
// (so that a GPU arena's staging moves them as one 2-D copy); rows back to back on that side
// are one plain range. Plain ranges that overlap or touch are merged: every byte once, in as
// few ranges as the copies allow (a strided range may share bytes with another range: staging
// copies such a byte twice, the same way, which changes nothing).
std::vector<ByteRange> MergedRanges(const CopyList& copies, CopySide side);

// Whether every range lies inside an arena of `arena_bytes`: InvalidArgument naming the first
// that does not ("<what>: range [offset, offset+span) ends past the arena's N bytes"), whose
// span overflows, or whose rows overlap (a stride below the length). Staging checks before it
// copies anything (bounds before bytes).
absl::Status CheckRanges(absl::Span<const ByteRange> ranges, uint64_t arena_bytes,
                         const std::string& what);

class ArenaStaging {
 public:
  virtual ~ArenaStaging() = default;

  // Copies the arena's bytes at `ranges` to the mirror, at the same offsets. When it returns
  // OK every byte is in the mirror. Fails, having copied nothing, when a range is outside the
  // arena (CheckRanges); a failure of the copy itself may leave some ranges copied.
  virtual absl::Status ToMirror(absl::Span<const ByteRange> ranges) = 0;

  // Copies the mirror's bytes at `ranges` back to the arena; OK means every byte is there.
  // Fails as ToMirror does.
  virtual absl::Status FromMirror(absl::Span<const ByteRange> ranges) = 0;

  // The arena's bytes (and the mirror's).
  virtual uint64_t bytes() const = 0;

  // One line for logs and errors: what is staged through what ("CUDA staging on device 0:
  // 4 chunks of 4194304 pinned bytes").
  virtual std::string Describe() const = 0;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_ARENA_STAGING_H_
