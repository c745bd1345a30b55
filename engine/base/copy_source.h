// A room's copies produced on demand (docs/ARCHITECTURE.md, layer 0): the planner's cursor
// behind it (control/plan/copy_stream.h), the transfer scheduler pulling a bounded chunk at a
// time as it posts, so that the first writes go out before the last copy is computed and no
// list of the whole room is ever materialised (a head-sliced room is half a million copies a
// rank). The envelope, known before the first copy, bounds every copy the source will produce,
// so that the scheduler checks a room's bounds before its first byte as it does for a list.
#ifndef KVRAIL_ENGINE_BASE_COPY_SOURCE_H_
#define KVRAIL_ENGINE_BASE_COPY_SOURCE_H_

#include <cstddef>
#include <cstdint>

#include "engine/base/copy_list.h"

namespace kvrail {

// Every copy lies in [src_begin, src_end) on the source side and [dst_begin, dst_end) on the
// destination side (offsets, as in Copy); `bytes` is the exact sum of their lengths and
// `copies` the number of copies before any merging (an upper bound of what Next yields).
struct CopyEnvelope {
  uint64_t src_begin = 0;
  uint64_t src_end = 0;
  uint64_t dst_begin = 0;
  uint64_t dst_end = 0;
  uint64_t bytes = 0;
  uint64_t copies = 0;
};

class CopySource {
 public:
  virtual ~CopySource() = default;
  virtual CopyEnvelope envelope() const = 0;
  // Writes up to `capacity` next copies to `out` and returns how many; 0 once all were given.
  // Called by one thread at a time.
  virtual size_t Next(Copy* out, size_t capacity) = 0;
};

// Appends everything `source` has left to `out` (where a list is needed: a room's digest).
inline void AppendAll(CopySource& source, CopyList& out) {
  constexpr size_t kChunk = 4096;
  while (true) {
    const size_t base = out.size();
    const size_t n = source.Next(out.Extend(kChunk), kChunk);
    out.Truncate(base + n);
    if (n == 0) return;
  }
}

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_BASE_COPY_SOURCE_H_
