// Copy lists reused from room to room, where a room still needs its whole list: a
// --verify-digest room, which hashes its copies before the first write (other rooms stream
// theirs: engine/base/copy_source.h). A head-sliced room is half a million copies a rank (12
// MiB); a list allocated fresh for each room faults every page of it in while the planner
// fills it, which on this loaded 2-core machine took 13-131 ms a room before the first byte
// (BENCHMARKS.md, "The sender's work before the first byte"), against under a millisecond for
// the planner's own work into a list that had been used before. The scheduler hands a room's
// list back once its outcome is out (transfer::Transfer::recycle), and the next room takes it with
// its pages already there.
#ifndef KVRAIL_ENGINE_TRANSFER_COPY_LIST_POOL_H_
#define KVRAIL_ENGINE_TRANSFER_COPY_LIST_POOL_H_

#include <cstddef>
#include <mutex>
#include <vector>

#include "engine/base/copy_list.h"

namespace kvrail::transfer {

class CopyListPool {
 public:
  // Keeps at most `max_bytes` of idle lists' storage (the largest ones); what would pass it is
  // freed. Nothing grows without bound: the pool holds at most that, whatever comes back.
  explicit CopyListPool(size_t max_bytes = size_t{128} << 20) : max_bytes_(max_bytes) {}

  // An empty list with the most storage of those kept (a fresh one when none is).
  CopyList Take();
  // Gives a list back (cleared here); freed when the pool would pass its bound with it.
  void Give(CopyList list);

  size_t idle_lists() const;
  size_t idle_bytes() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::vector<CopyList> idle_;  // guarded by mu_
  size_t idle_bytes_ = 0;       // guarded by mu_
};

}  // namespace kvrail::transfer

#endif  // KVRAIL_ENGINE_TRANSFER_COPY_LIST_POOL_H_
