// The transfer scheduler (docs/ARCHITECTURE.md, layer 6). Its unit is a transfer: one room's
// writes to one peer (a prefill room with two decode targets is two transfers). It turns a
// transfer's coalesced copy list into one-sided writes on a Transport, and says when they have
// landed.
//
// For each transfer:
//   1. Bounds before bytes: every copy's source range is checked against the source region and
//      every destination range against the peer's registered regions (the handshake
//      descriptor) before anything is posted. A transfer that fails is rejected by Submit with
//      InvalidArgument naming the copy, and nothing is written.
//   2. Copies longer than the slice size are cut into slices (the transport's max_write_bytes
//      at most).
//   3. Slices go out in batches, each to a lane of the peer among the transfer's lanes
//      (Transfer::lanes; every lane by default: striping): where a lane stores the rows of several
//      peers' batches in one pass (Capabilities::lanes_share_rows: UCX over shared memory), a
//      transfer's k-th batch to its k-th lane (mod its lanes) while that lane has room, so that
//      transfers cut alike (a prefill of the smaller TP sending each decode rank its heads of the
//      same source rows) put their batches of the same rows on one lane, which stores them in one
//      pass that reads each source row once (docs/decisions/0020); otherwise, or when
//      that lane is full, to the lane with the fewest bytes in flight. The scheduler keeps at
//      most max_inflight_bytes_per_endpoint posted and not yet locally complete per (peer, lane):
//      UCX over tcp collapses when many large puts are in flight. A batch carries at most a lane's
//      share of its transfer (its bytes / its lanes, a slice at least), so that a transfer smaller
//      than the lanes' bounds together (one layer of a layer-wise room) still goes out on every
//      lane it has. Transfers of one peer are served first come, first served, so early transfers
//      finish early. Work follows the lanes that complete: a batch is decided when a lane has room
//      under its bound, so a lane whose writes do not complete (its thread off its core, a slow
//      peer) is given nothing more once its bound is full, and the others carry the rest, its
//      k-th batches too; with UCX over shared memory the
//      bound is one 1 MiB batch.
//   4. Success means landed: once every slice is posted, each lane the transfer used is flushed,
//      and the transfer completes OK only when all its batches and flushes have.
//   5. A transfer fails with the first transport error, with DeadlineExceeded at its deadline, or
//      with Cancelled on Cancel (or FailPeer). A failed transfer posts nothing more, and Failed
//      means fenced (docs/ARCHITECTURE.md, "Failed means fenced"): its outcome is delivered
//      only once no write of it can land any more. The scheduler waits until every call made
//      for the transfer has completed, then flushes each lane the transfer wrote on (Transport,
//      "Fencing"); a peer whose fence has not drained within fence_timeout is disconnected
//      (Transport::Disconnect: nothing it carried lands afterwards), failing its other transfers
//      too, and the outcome says so (peer_disconnected). So a failure outcome comes at most
//      fence_timeout after the failure, plus the transport's own cancellation.
//
// Calls to the transport are decided under a peer's lock and made outside it, each lane's in
// order, by the thread whose completion freed transfer on that lane (its progress thread), so the
// lanes of one peer post (over shared memory: copy) on several cores at once.
//
// Each accepted transfer's `done` is called exactly once, never inline from Submit or Cancel, with
// no scheduler lock held: a transfer that landed by the thread of the completion that landed it
// (the transport's progress thread: no hop to another thread between the last flush and the
// caller), any other outcome by the scheduler's delivery thread. So `done` may call the
// scheduler and what a transport's completion may call (transport.h), and should be brief on
// the landed path: that lane's next completions wait for it.
//
// Locks: transfers meet only on their peer's queue (posting, completions) and on one of 16 stripes
// of the table of transfers in flight (Submit, Cancel, a transfer's end), never on a lock shared by
// every transfer; stats are counters. The delivery thread's lock is taken by failures and by a
// transfer whose deadline comes before every earlier one's.
#ifndef KVRAIL_ENGINE_TRANSFER_SCHEDULER_H_
#define KVRAIL_ENGINE_TRANSFER_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/base/copy_list.h"
#include "engine/base/copy_source.h"
#include "engine/transfer/lane_set.h"
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"

namespace kvrail::transfer {

struct SchedulerOptions {
  // The longest write posted; 0 means min(4 MiB, the transport's max_write_bytes). Larger
  // values are clamped to max_write_bytes.
  uint64_t slice_bytes = 0;
  // Bytes posted and not yet locally complete, per (peer, lane); 0 means the transport's
  // advice (Capabilities::max_inflight_bytes_per_endpoint), or 64 MiB without one. A single
  // slice larger than the bound is still posted alone.
  uint64_t max_inflight_bytes_per_endpoint = 0;
  // The most writes in one PostWrites batch.
  uint32_t max_writes_per_batch = 256;
  // How long a failed transfer's writes may take to drain (every call made for it complete, then a
  // flush of each lane it used) before its peer is disconnected to fence it.
  absl::Duration fence_timeout = absl::Seconds(5);
};

// What one transfer cost. `duration` runs from Submit to the transfer's outcome.
struct TransferStats {
  uint64_t bytes = 0;    // payload bytes of the copies
  uint64_t copies = 0;   // copies submitted
  uint64_t writes = 0;   // slices posted
  uint64_t batches = 0;  // PostWrites calls
  uint32_t lanes_used = 0;
  absl::Duration duration;
};

// A transfer's outcome. Either way no write of the transfer lands after it is delivered: OK means
// every byte landed (flushed); a failure means the transfer was fenced.
struct TransferOutcome {
  uint64_t transfer_id = 0;
  absl::Status status;
  TransferStats stats;
  // The fence disconnected the peer (fence_timeout, or shutdown): its PeerId is gone, and the
  // caller connects again for later transfers.
  bool peer_disconnected = false;
  // Whether the outcome proves that nothing of the transfer lands any more: always for OK and for
  // a failure fenced by flushes that all came back OK; for one whose flush failed or whose peer
  // was disconnected, only on a backend where a failed or disconnected link carries nothing
  // more (Capabilities::disconnect_fences). Otherwise writes the backend had already handed
  // over may still land (a stopped peer that resumes copies what its socket holds), and the
  // caller must say so.
  bool fence_proven = true;
};

using TransferDone = std::function<void(const TransferOutcome&)>;

// One batch of a transfer's writes on one lane, as it is posted and as it completes locally (for
// metrics: Transfer::on_batch).
struct BatchEvent {
  int lane = 0;
  uint64_t bytes = 0;      // payload bytes of the batch's writes
  uint64_t writes = 0;     // writes in the batch
  bool completed = false;  // false: posted now; true: completed now, with `ok`
  bool ok = false;
};

// One room's writes to one peer.
struct Transfer {
  // The caller's name for this transfer, unique among transfers in flight (a prefill room with
  // two decode targets submits two transfers).
  uint64_t transfer_id = 0;
  transport::PeerId peer = 0;
  // The registered local region the copies read from, and its length.
  transport::RegionId source = 0;
  uint64_t source_length = 0;
  // The peer's registered regions (from its handshake descriptor), for the bounds check.
  std::shared_ptr<const transport::RemoteRegions> remote;
  // B_dst (CACHEPD §6.9): copies' dst_offset are relative to it.
  uint64_t remote_base = 0;
  // When nonzero, every copy must also lie within [remote_base, remote_base + remote_length):
  // the destination's own arena, not merely some region of the peer.
  uint64_t remote_length = 0;
  // src_offset into the source region, dst_offset from remote_base; coalesced or not.
  CopyList copies;
  // Instead of `copies` (which must then be empty): the copies produced on demand, pulled a
  // chunk at a time as the transfer posts (engine/base/copy_source.h). Submit checks the source's
  // envelope as it checks a list's copies; every copy pulled is checked against the envelope
  // before it is posted, and a source that breaks it fails the transfer (Internal).
  std::unique_ptr<CopySource> stream;
  absl::Time deadline = absl::InfiniteFuture();
  TransferDone done;
  // When set, receives `copies` back (with their storage) once the transfer needs them no more,
  // just before `done`, on the delivery thread (a CopyListPool's Give); else they are freed.
  std::function<void(CopyList)> recycle;
  // When set, called for each batch posted and each batch completed (BatchEvent), on the
  // thread that posts or completes it, with no scheduler lock held; it must be quick (count).
  std::function<void(const BatchEvent&)> on_batch;
  // The peer's lanes the transfer may post on (step 3 stripes over these alone); the default is
  // every lane. Submit refuses a set that holds none of the transport's lanes.
  LaneSet lanes;
};

struct SchedulerStats {
  uint64_t transfers_ok = 0;
  uint64_t transfers_failed = 0;
  uint64_t transfers_rejected = 0;  // by Submit's checks: nothing posted
  uint64_t bytes_landed = 0;        // of transfers that completed OK
  uint64_t writes = 0;
  uint64_t batches = 0;
};

class Scheduler {
 public:
  // `transport` must outlive the scheduler and every completion of the writes it posted.
  Scheduler(transport::Transport* transport, SchedulerOptions options = {});
  // Fails the transfers still in flight with Cancelled, fences them by disconnecting their peers,
  // delivers every outcome, and stops the delivery thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks and queues a transfer. InvalidArgument when `done` is empty, `remote` is null, both
  // `copies` and `stream` are given, or a copy (or a stream's envelope, or the first chunk of
  // it) breaks the bounds (naming the copy and the range), AlreadyExists for a transfer id in
  // flight, FailedPrecondition after shutdown. A transfer with no copies completes OK.
  absl::Status Submit(Transfer transfer);

  // Fails a transfer in flight with Cancelled (`why` in its message); it posts nothing more, and
  // its outcome follows once it is fenced. Returns without waiting for the fence. NotFound
  // when the id is not in flight (unknown, completed, or already failed).
  absl::Status Cancel(uint64_t transfer_id, absl::string_view why = "cancelled");

  // Fails every transfer in flight to `peer` with `status` (e.g. the peer's sidecar died), as
  // Cancel does.
  void FailPeer(transport::PeerId peer, const absl::Status& status);

  // Frees what the scheduler keeps for `peer` (its queue), once nothing of it is in flight: no
  // transfer, and no call made or queued. Returns false, changing nothing, while something is;
  // true when it was freed or was never known. For a peer that is gone (disconnected), so that
  // peers coming and going leave nothing behind.
  bool ForgetPeer(transport::PeerId peer);
  // Peers whose queue the scheduler keeps.
  size_t peers() const;

  // The slice size and in-flight bound in force.
  uint64_t slice_bytes() const;
  uint64_t max_inflight_bytes_per_endpoint() const;
  uint64_t transfers_in_flight() const;
  SchedulerStats stats() const;

  struct Core;

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace kvrail::transfer

#endif  // KVRAIL_ENGINE_TRANSFER_SCHEDULER_H_
