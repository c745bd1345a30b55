// One measured window of `kvrail bench raw`: batches of equal-sized one-sided writes, posted
// through the Transport interface as the transfer scheduler would (sliced, striped over lanes,
// bytes in flight bounded per lane), then a Flush of every lane, so the window counts bytes that
// landed ("Success means landed").
//
// Lanes are independent: each generates its own slices of every batch and posts, flushes and
// counts them under its own lock (they may run a few batches apart), and the window ends when
// every lane's final Flush has completed. Posting is completion-driven: the first posts come
// from the caller, every later one from the completion of an earlier post, on the transport's
// progress thread; a lane's calls are made by the thread of that lane's completions, outside
// the lane's lock, so lanes post (over shared memory: copy) on several cores at once without
// meeting on a lock. The caller's thread only waits, so on a small machine the bench adds no
// busy thread of its own to the transport's.
#ifndef KVRAIL_BENCH_RAW_WRITE_WINDOW_H_
#define KVRAIL_BENCH_RAW_WRITE_WINDOW_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/transport/transport.h"

namespace kvrail::bench {

struct WindowSpec {
  uint64_t block_bytes = 0;  // each write of a batch, before slicing
  int batch = 1;             // writes per batch; one PostWrites never mixes two batches
  // Source and destination cycle through `working_set` bytes: write k of the window goes from
  // source offset source_offset + (k % slots) * block_bytes to destination address
  // destination_address + the same, slots = working_set / block_bytes (at least 1).
  uint64_t working_set = 0;
  uint64_t source_offset = 0;
  uint64_t destination_address = 0;

  int lanes = 1;
  // Writes longer than this are cut into slices of this size. Slice i of the working set
  // (counting every slot's slices in address order) always goes to lane i % lanes: a batch of
  // one large write still uses every lane, distinct blocks alternate, and two lanes never write
  // the same bytes at once (a working set of one unsliced block uses one lane).
  uint64_t slice_bytes = uint64_t{1} << 20;
  // Bytes in flight per lane: posted and not yet landed. By the Transport contract a batch's
  // completion is only local, and only a Flush says bytes landed, so a lane flushes once
  // `flush_bytes` were posted on it since its last flush (0: half the bound), and its bytes
  // count as in flight until a flush covering them completes. A lane posts while its bytes in
  // flight stay within `inflight_bytes_per_lane` (one post always may go) and it has fewer than
  // `posts_per_lane` PostWrites calls outstanding.
  uint64_t inflight_bytes_per_lane = uint64_t{8} << 20;
  uint64_t flush_bytes = 0;
  int posts_per_lane = 2;
  // The most bytes one PostWrites carries.
  uint64_t post_bytes = uint64_t{4} << 20;

  // New batches start until `duration` has passed since the first post, or until
  // `max_bytes` (when > 0) have been posted. At the deadline, slices not yet posted are dropped:
  // a batch larger than the window is measured in part.
  absl::Duration duration = absl::Milliseconds(500);
  uint64_t max_bytes = 0;
  // How long to wait for the transport before giving up on the window.
  absl::Duration patience = absl::Seconds(120);
};

struct WindowResult {
  uint64_t bytes = 0;      // posted, completed and flushed
  uint64_t writes = 0;     // Write entries posted (slices)
  uint64_t posts = 0;      // PostWrites calls
  uint64_t flushes = 0;    // Flush calls, the final one of every lane included
  absl::Duration elapsed;  // from the first post to the last Flush's completion

  double gbps() const;  // decimal: 1e9 bytes per second
  double blocks_per_s(uint64_t block_bytes) const;
};

// Runs one window from `source` (a registered local region) to `peer`. The first failure of a
// post, a batch or a flush ends the window and is returned; DeadlineExceeded when the transport
// has not finished within spec.patience. InvalidArgument for a spec that cannot run (zero
// sizes, a working set smaller than a block, lanes outside the transport's).
absl::StatusOr<WindowResult> RunWriteWindow(transport::Transport& transport, transport::PeerId peer,
                                            transport::RegionId source, const WindowSpec& spec);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_WRITE_WINDOW_H_
