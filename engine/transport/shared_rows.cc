#include "engine/transport/shared_rows.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace kvrail::transport {

void SharedRowRuns(std::vector<StoredRows>& writes, std::vector<SharedRowRun>* runs) {
  // Addresses as numbers throughout: the writes may read different regions.
  const auto address = [](const std::byte* p) { return reinterpret_cast<uintptr_t>(p); };
  std::sort(writes.begin(), writes.end(), [&](const StoredRows& a, const StoredRows& b) {
    return std::make_tuple(a.src_stride, a.rows, address(a.src)) <
           std::make_tuple(b.src_stride, b.rows, address(b.src));
  });
  runs->clear();
  size_t begin = 0;
  while (begin < writes.size()) {
    const StoredRows& first = writes[begin];
    size_t end = begin + 1;
    if (first.rows > 1 && first.length < first.src_stride) {
      const uintptr_t row = address(first.src);
      while (end < writes.size()) {
        const StoredRows& prev = writes[end - 1];
        const StoredRows& next = writes[end];
        const uintptr_t at = address(next.src);
        const bool same_rows = next.rows == first.rows && next.src_stride == first.src_stride;
        if (!same_rows || at != address(prev.src) + prev.length ||
            at - row + next.length > first.src_stride) {
          break;
        }
        ++end;
      }
    }
    if (end - begin >= 2) runs->push_back({begin, end});
    begin = end;
  }
}

}  // namespace kvrail::transport
