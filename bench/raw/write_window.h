// One measured window of `kvrail bench raw`, driven through the product's transfer scheduler
// (engine/transfer/scheduler.h): each batch of equal-sized writes is one Transfer, and the
// scheduler slices, bounds-checks, stripes over lanes, bounds the bytes in flight per lane and
// flushes, as it does for a real room's. The window only keeps several transfers in flight (so one
// transfer's flush overlaps the next transfer's posts) and counts the bytes of the transfers whose
// outcome was OK: Success means landed.
//
// Transfers are submitted from the outcome of an earlier transfer, which the scheduler runs on the
// lane thread whose flush landed it (the first ones from the caller), as the prefill sidecar's
// status follows its transfer's last flush, so the bench adds no busy thread of its own to the
// scheduler's and the transport's; the caller's thread only waits.
#ifndef KVRAIL_BENCH_RAW_WRITE_WINDOW_H_
#define KVRAIL_BENCH_RAW_WRITE_WINDOW_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"

namespace kvrail::bench {

// Where a window's transfers go: what the sidecar puts into every Transfer
// (control/sidecar/prefill_transfers.cc), from the connection and the peer's descriptor.
struct WindowTarget {
  transport::PeerId peer = 0;
  transport::RegionId source = 0;  // the registered local region the writes read
  uint64_t source_length = 0;
  // The peer's regions from its handshake descriptor, for the scheduler's bounds check.
  std::shared_ptr<const transport::RemoteRegions> remote;
  // The destination arena: copies' destination offsets are from remote_base, and every write
  // must lie within [remote_base, remote_base + remote_length).
  uint64_t remote_base = 0;
  uint64_t remote_length = 0;
};

struct WindowSpec {
  uint64_t block_bytes = 0;  // each write of a batch
  int batch = 1;             // writes per batch; a batch is one transfer
  // Source and destination cycle through `working_set` bytes: write k of the window goes from
  // source offset source_offset + (k % slots) * block_bytes to destination offset
  // destination_offset + the same (from the target's remote_base), slots = working_set /
  // block_bytes (at least 1).
  uint64_t working_set = 0;
  uint64_t source_offset = 0;
  uint64_t destination_offset = 0;
  // Bytes of the destination from destination_offset the window may write (0: the working set
  // alone). Transfers in flight at once write disjoint copies of the working set in it, copy c at
  // destination_offset + c * slots * block_bytes (the first transfer copy 0): two transfers never
  // write the same bytes at once (over shared memory, two lanes would store into them together: a
  // data race, if of equal bytes). So at most destination_span / (slots * block_bytes) transfers
  // are in flight, at least 1.
  uint64_t destination_span = 0;
  // A batch of more than this many bytes is sent as consecutive transfers of whole blocks (at
  // least one) of at most this many: a 1024 x 64 MiB batch is not one 64 GiB transfer.
  uint64_t max_transfer_bytes = uint64_t{256} << 20;

  // Transfers in flight: enough to hold `inflight_bytes` (e.g. lanes x the scheduler's bound per
  // lane), at least 2 (a transfer's flush overlaps the next transfer's posts) and at most
  // `max_transfers`.
  uint64_t inflight_bytes = uint64_t{8} << 20;
  int max_transfers = 128;

  // New transfers start until `duration` has passed since the first Submit, or until `max_bytes`
  // (when > 0) have been submitted; the window ends when every transfer submitted has its outcome.
  absl::Duration duration = absl::Milliseconds(500);
  uint64_t max_bytes = 0;
  // How long to wait for the transfers' outcomes before giving up on the window.
  absl::Duration patience = absl::Seconds(120);
};

struct WindowResult {
  uint64_t bytes = 0;      // of transfers whose outcome was OK (landed)
  uint64_t blocks = 0;     // block writes in those transfers
  uint64_t transfers = 0;  // transfers whose outcome was OK
  uint64_t writes = 0;     // slices the scheduler posted for them
  uint64_t posts = 0;      // their PostWrites calls
  uint64_t flushes = 0;    // their Flush calls (one per lane a transfer used)
  absl::Duration elapsed;  // from the first Submit to the last outcome

  double gbps() const;  // decimal: 1e9 bytes per second
  double blocks_per_s(uint64_t block_bytes) const;
};

// The transfers in flight for a window of `spec` (see WindowSpec::inflight_bytes).
int TransfersInFlight(const WindowSpec& spec);

// Runs one window on `scheduler` to `target`. The first transfer that fails (a transport error, or
// a Submit the scheduler refused: a write past the destination arena or the source region fails
// its bounds check with InvalidArgument naming the copy) ends the window: no transfer starts after
// it, those in flight finish, and its status is returned. DeadlineExceeded when the transfers'
// outcomes have not all come within spec.patience (the transfers still in flight are cancelled).
// InvalidArgument, naming the fields and the rule, for a spec that cannot run (zero sizes, a
// working set smaller than a block, no target regions).
absl::StatusOr<WindowResult> RunWriteWindow(transfer::Scheduler& scheduler,
                                            const WindowTarget& target, const WindowSpec& spec);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_WRITE_WINDOW_H_
