// The UCX backend's lanes (ucx_transport.h, "Threading" and "Locks"): one worker per lane, the
// thread that alone calls into it, and the queue of jobs that feeds that thread; the operations
// (batches, flushes, connect and close jobs) the queue carries, their completions, and the
// thread's loop (RunLane): take the queued jobs, store the rows several peers' batches share
// (StoreSharedRows, ucx_puts.h), and issue them (Issue: over puts, ucx_puts.h, or
// active messages, ucx_am.h; connects and closes, ucx_endpoint.h), progress the worker, then
// deliver completions holding no lock.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_LANE_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_LANE_H_

#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/transport/landing_copy.h"
#include "engine/transport/shared_rows.h"
#include "engine/transport/transport.h"
#include "engine/transport/ucx/am_protocol.h"
#include "engine/transport/ucx/ucx_endpoint.h"
#include "engine/transport/ucx/ucx_memory.h"

namespace kvrail::transport::ucx_internal {

// What the lanes' threads read of their transport. `regions` is written holding the transport's
// mutex and every lane's mutexes of both kinds (AllLanes), and read holding any one of them (a
// post its lane's queue mutex, a lane's thread its worker mutex). The rest is fixed once Create
// returns, but `peer_errors`, cleared once, when UCX has no peer-failure handling to give.
struct Shared {
  Regions regions;
  // Writes go as active messages of at most am_slice_bytes (tcp may carry them); else puts.
  bool am_writes = false;
  uint64_t am_slice_bytes = 0;
  // How the lanes' copies into landing memory store (UcxOptions::landing_stores).
  LandingStores landing_stores = LandingStores::kAuto;
  // Sent to every peer as this writer's name where writes go as active messages (kHelloAm).
  std::string writer_name;
  // Endpoints ask UCX for peer-failure handling; cleared, once, when UCX has none to give.
  std::atomic<bool> peer_errors{true};
};

enum class OpKind {
  kBatch,    // PostWrites
  kFlush,    // Flush over puts (and Connect's wireup): ucp_ep_flush_nbx
  kAmFlush,  // Flush over active messages: done when the peer's am::FlushReply arrives
  // Jobs that only the lane's queue carries, never delivered:
  kConnect,  // Connect: the peer's endpoint on this lane; then the op is the wireup's kFlush
  kClose,    // Disconnect, Close, a failed Connect: cancel the peer's ops here, close its endpoint
};

// One job of a lane's queue, and then (batches and flushes) one operation in UCX. Filled by the
// posting thread under the lane's queue mutex; the lane's thread's alone once it is taken off
// the queue. Freed, or recycled, once it is delivered and no UCX request still points at it.
struct Op {
  PeerState* peer = nullptr;  // kept alive by the peer's close jobs until its endpoints close
  int lane = 0;
  OpKind kind = OpKind::kBatch;
  int requests = 0;  // UCX requests outstanding with this op as user data
  bool delivered = false;
  absl::Status status;  // the first failure of a batch's puts
  Completion done;
  Lane* home = nullptr;  // the lane whose `due` list gets the completion
  uint64_t seq = 0;      // kAmFlush: the number the peer's answer names
  // Active-message headers: UCX reads each until its send completes. Reserved before the first
  // send (so none moves) and kept with its capacity when the op is recycled.
  std::vector<am::AmHeader> headers;
  // Payloads of more pieces than UCX's zero-copy send takes (am_protocol.h, kMostGatherPieces),
  // packed back to back from its start, each kept like `headers` until its send completes; a
  // message whose send completed at once leaves its bytes to the next one (IssueAmWrites). Only
  // grown: its bytes past what a batch packs are left over from earlier batches.
  std::vector<std::byte> packed;
  // kRowsAm messages sent as gather lists: each one's PackedRows, first in its list, kept the
  // same way; and the lists UCX reads those payloads from.
  std::vector<am::PackedRows> rows;
  std::vector<ucp_dt_iov_t> gather;
  // The batch cut into active messages (am_protocol.h, PlanMessages).
  std::vector<am::AmMessage> plan;
  // A batch as PostWrites checked it: the source region (sent only while it is registered),
  // its bytes, the writes and each one's index in the peer's descriptor regions (its rkey).
  // The vectors keep their capacity when the op is recycled.
  RegionId source = 0;
  const std::byte* base = nullptr;
  std::vector<Write> writes;
  std::vector<int> region_of;
  // Which writes a shared pass of the lane's round stored already (StoreSharedRows): empty when
  // none did, else one flag per write.
  std::vector<char> stored_together;
  // It waited a round already for another peer's batch of the same rows (StoreSharedRows).
  bool waited = false;
  // kClose: the peer, alive until its endpoint on this lane has closed.
  std::shared_ptr<PeerState> closing;

  // As a new Op, but for the vectors' capacity, each kept up to its bound (Lane::Recycle). Every
  // field above is reset here.
  void Reset() {
    peer = nullptr;
    lane = 0;
    kind = OpKind::kBatch;
    requests = 0;
    delivered = false;
    status = absl::OkStatus();
    done = nullptr;
    home = nullptr;
    seq = 0;
    waited = false;
    source = 0;
    base = nullptr;
    closing.reset();
    ClearKeeping(headers, 4096);
    ClearKeeping(rows, 4096);
    ClearKeeping(plan, 4096);
    // Its size is kept, not only its capacity: growing it again would zero it first.
    if (packed.size() > kKeptPackedBytes) std::vector<std::byte>().swap(packed);
    ClearKeeping(gather, 8192);
    const bool keep_writes = writes.capacity() <= 1024;
    ClearKeeping(writes, keep_writes ? 1024 : 0);
    ClearKeeping(region_of, keep_writes ? SIZE_MAX : 0);
    ClearKeeping(stored_together, keep_writes ? SIZE_MAX : 0);
  }

 private:
  // A batch packs at most its own payload and entries (the scheduler's batch holds 256 rows:
  // 256 KiB of KiB rows); a larger one's storage is not kept. So what the spare ops keep is
  // about the packed bytes that were in flight at once at the peak (the scheduler's bound per
  // peer and lane: 4 MiB over tcp), not kSpareOps times this.
  static constexpr size_t kKeptPackedBytes = size_t{1} << 20;
  // Empties `v`, keeping its storage only up to `most` elements.
  template <typename T>
  static void ClearKeeping(std::vector<T>& v, size_t most) {
    if (v.capacity() > most) {
      std::vector<T>().swap(v);
    } else {
      v.clear();
    }
  }
};

// Unavailable when `op`'s peer's process is known to have exited (PeerState::owner), else OK:
// over shared memory its writes went into memory nobody owns, and neither the stores nor UCX's
// flush of them fail for that. On `op`'s lane's thread. It asks the kernel (a poll of the
// pidfd) at most once per kOwnerSeenFor per peer and lane: so a flush completes OK only if the
// owner was seen alive at most that long before, where UCX's keepalive alone took a second. (A
// poll per flush cost 12 % of a transfer of one 4 KiB write: `kvrail bench raw --link shm`.)
inline constexpr std::chrono::microseconds kOwnerSeenFor{50};
absl::Status OwnerGone(const Op& op);

// A completion the lane's thread has taken from the worker, with its status, due to be
// delivered (outside the worker's lock).
struct DueCompletion {
  Completion done;
  absl::Status status;
};

// One lane: a worker, the thread that alone calls into it, and the queue that feeds that thread.
struct Lane {
  int index = 0;
  Shared* shared = nullptr;       // the transport's, read as its comment says
  ucp_worker_h worker = nullptr;  // made by AddLane; destroyed by the thread (or ReleaseAll)
  std::string address;            // ucp_worker_get_address bytes
  std::thread thread;
  ~Lane();
  // What an idle lane's thread sleeps on (RunLane): the worker's event fd (UCX's; -1 where the
  // worker offers none or cannot be armed: the lane then wakes for jobs and at the end of its
  // nap only; the thread's own after AddLane), and an eventfd of its own that a queued job or
  // the stop writes while `sleeping`.
  int worker_fd = -1;
  int wake_fd = -1;
  // What ended the thread's sleeps (TransportCounters): written by the thread, read by any.
  std::atomic<uint64_t> wakes_by_event{0};
  std::atomic<uint64_t> wakes_by_job{0};
  std::atomic<uint64_t> naps_ended{0};
  // Writes stored in shared passes (StoreSharedRows): written by the thread, read by any.
  std::atomic<uint64_t> writes_stored_together{0};

  // Held by the lane's thread while it calls into the worker (its jobs, then a progress), never
  // while it delivers completions or sleeps; posts, flushes and Connect never take it. The calls
  // that change what the thread reads there (the regions, a peer's `closed`) take every lane's,
  // so that when they return no lane still copies into a withdrawn region or sends for a closed
  // peer. Taken before `mu`.
  std::mutex worker_mu;

  // The queue's mutex: held to push or take jobs, never across a UCX call or a wait.
  std::mutex mu;
  // Guarded by mu:
  std::vector<Op*> jobs;  // oldest first; the thread takes them all at once
  bool stop = false;      // Close: tear down and exit (set with WakeLocked)
  bool sleeping = false;  // the thread is in (or about to enter) its wait for events
  // Ops for the next posts (a post over shared memory is a copy of a few microseconds, and a
  // malloc and a free per post showed in perf); at most kSpareOps.
  static constexpr size_t kSpareOps = 256;
  std::vector<std::unique_ptr<Op>> spare;

  // The thread's own:
  std::vector<DueCompletion> due;  // swapped with the delivery round's, so delivery never allocates
  std::vector<std::unique_ptr<Op>> recycled;  // finished ops, handed to `spare` at the next take
  // Endpoint-close requests, each with the peer whose rkeys on this lane go when it finishes.
  std::vector<std::pair<void*, std::shared_ptr<PeerState>>> closing;
  // This round ends with the lane's stop (the transport's Close): its close jobs fence first
  // (IssueClose), and `fencing` holds the peers whose endpoint closes once the target answered
  // their last flush, or kCloseFenceWait passed (TearDown).
  bool tearing_down = false;
  std::vector<std::shared_ptr<PeerState>> fencing;
  static constexpr std::chrono::seconds kCloseFenceWait{2};
  // The active-message path: this lane's peers by token (for their flushes' answers), and what
  // it keeps for each writer that writes into it (the lane's thread, and RefuseWriter, holding
  // worker_mu).
  std::unordered_map<uint64_t, PeerState*> outbound;
  am::AmTarget target;
  // StoreSharedRows' lists of a round's writes, their runs, a run's slices and what each job of
  // the round holds, kept with their capacity.
  std::vector<StoredRows> round_rows;
  std::vector<SharedRowRun> round_runs;
  std::vector<LandingSlice> round_slices;
  struct RoundBatch {
    uintptr_t first = 0;  // the least address its writes that may share rows read
    bool shares = false;  // it holds such writes
  };
  std::vector<RoundBatch> round_batches;

  // mu held. An op for a post, from the spare ones when there is one.
  Op* TakeOpLocked() {
    if (spare.empty()) return new Op;
    Op* op = spare.back().release();
    spare.pop_back();
    return op;
  }

  // mu held. Queues `op` as a job of `kind` for `peer` on this lane and wakes the thread.
  void PushLocked(Op* op, PeerState& peer, OpKind kind, Completion done) {
    op->peer = &peer;
    op->lane = index;
    op->kind = kind;
    op->done = std::move(done);
    op->home = this;
    jobs.push_back(op);
    WakeLocked();
  }

  // mu held. Wakes the thread if it sleeps: one write to `wake_fd`, made only then.
  void WakeLocked();

  // mu held, on the thread. Takes every queued job into `taken` (empty) and gives the ops that
  // finished since back to the spare ones.
  void TakeJobsLocked(std::vector<Op*>& taken) {
    taken.swap(jobs);
    for (auto& op : recycled) {
      if (spare.size() >= kSpareOps) break;
      spare.push_back(std::move(op));
    }
    recycled.clear();  // deletes what did not fit
  }

  // On the thread, from here on. Moves `op`'s completion onto the `due` list once; recycles it
  // when UCX is done too.
  void Finish(Op* op, absl::Status status) {
    if (!op->delivered) {
      op->delivered = true;
      PeerLane& pl = op->peer->lanes[op->lane];
      auto& ops = pl.ops;
      if (ops.front() == op) {
        ops.pop_front();  // the usual case: a lane's operations finish in order
      } else {
        ops.erase(std::find(ops.begin(), ops.end(), op));
      }
      if (op->kind == OpKind::kBatch && !status.ok() && pl.error.ok()) pl.error = status;
      due.push_back({std::move(op->done), std::move(status)});
    }
    if (op->requests == 0) Recycle(op);
  }

  // Around the UCX calls that post `op`: UCX may call back inside them (an endpoint that fails
  // while sending finishes the op), and the hold keeps the op alive until Release.
  static void Hold(Op* op) { ++op->requests; }
  // Ends the hold. Returns false when `op` has been delivered meanwhile (and maybe recycled:
  // the caller must not touch it again); true when it is still the caller's.
  bool Release(Op* op) {
    --op->requests;
    if (!op->delivered) return true;
    if (op->requests == 0) Recycle(op);
    return false;
  }

  // A flush's outcome: the first failure of the batches before it, else `status`, else (a
  // flush over puts or stores) whether the peer's process still lives (OwnerGone).
  void FinishFlush(Op* op, absl::Status status) {
    absl::Status result = std::exchange(op->peer->lanes[op->lane].error, absl::OkStatus());
    if (!result.ok()) status = std::move(result);
    if (status.ok() && op->kind == OpKind::kFlush) status = OwnerGone(*op);
    Finish(op, std::move(status));
  }

  // Keeps a finished op (or a job done with) for a later post, with its vectors' capacity up to
  // a bound (at most kSpareOps ops wait, each keeping at most 1024 writes, about 24 KiB). Resets
  // it in place (Op::Reset): moving seven vectors out and back was 6 % of a lane's time at a
  // transfer of one 64 KiB write.
  void Recycle(Op* op) {
    op->Reset();
    recycled.emplace_back(op);
  }

  // Frees the close requests that finished, and their peers' rkeys on this lane.
  void ReapClosed() {
    closing.erase(std::remove_if(closing.begin(), closing.end(),
                                 [this](std::pair<void*, std::shared_ptr<PeerState>>& entry) {
                                   if (ucp_request_check_status(entry.first) == UCS_INPROGRESS) {
                                     return false;
                                   }
                                   ucp_request_free(entry.first);
                                   entry.second->DestroyRkeys(index);
                                   return true;
                                 }),
                  closing.end());
  }
};

// Every lane's worker mutex, then every lane's queue mutex, each in lane order, released in
// reverse: with the transport's mu_, what a writer of the transport-wide state holds. A post
// reads that state holding only its lane's queue mutex, a lane's thread holding only its
// worker mutex.
class AllLanes {
 public:
  explicit AllLanes(const std::vector<std::unique_ptr<Lane>>& lanes) : lanes_(lanes) {
    for (const auto& lane : lanes_) lane->worker_mu.lock();
    for (const auto& lane : lanes_) lane->mu.lock();
  }
  ~AllLanes() {
    for (auto it = lanes_.rbegin(); it != lanes_.rend(); ++it) (*it)->mu.unlock();
    for (auto it = lanes_.rbegin(); it != lanes_.rend(); ++it) (*it)->worker_mu.unlock();
  }
  AllLanes(const AllLanes&) = delete;
  AllLanes& operator=(const AllLanes&) = delete;

 private:
  const std::vector<std::unique_ptr<Lane>>& lanes_;
};

// Makes lane `index`: its worker on `context` (serialised: this thread sets it up, then only the
// lane's thread calls into it), the active-message handlers (ucx_am.h) and its address, and
// appends it to `lanes` once its worker exists (so that a failure later still destroys it).
// Unavailable with UCX's status, naming the call and the lane.
absl::Status AddLane(ucp_context_h context, int index, Shared* shared,
                     std::vector<std::unique_ptr<Lane>>& lanes);

// The lane's thread: take the queued jobs and issue them, progress, reap closed endpoints
// (holding the lane's worker mutex), then deliver completions (holding nothing); at `stop`,
// tear the lane down (its endpoints' closes finished, the worker destroyed) and deliver what is
// left. Named "ucx-lane<index>".
void RunLane(Lane& lane);

// Why Issue finishes a batch or a flush without sending it, on `lane`'s thread holding its worker
// mutex: its peer was closed, the peer's endpoint on this lane failed, or (a batch) its source
// region was deregistered; kNo when it is sent. StoreSharedRows stores only batches of kNo.
enum class Unsent { kNo, kPeerClosed, kEndpointFailed, kSourceWithdrawn };
Unsent WhyUnsent(const Lane& lane, const Op& op);

// On `lane`'s thread, holding its worker mutex: the UCX calls of one job. A batch or flush of a
// closed peer is cancelled, and a batch whose source was deregistered too.
void Issue(Lane& lane, Op* op);

// What a post and a flush give UCX with every request: the completion handler, and the op.
ucp_request_param_t RequestParam(Op* op);
// A write's failure to start, as a batch reports it: Unavailable (UCX cancels only the requests
// of an endpoint that failed).
absl::Status PostFailure(ucs_status_ptr_t request, const std::string& what);
// What a batch's and a flush's errors start with.
std::string BatchContext(PeerId peer, int lane, RegionId source);
std::string FlushContext(PeerId peer, int lane);
// A batch's or a flush's cancellation: Disconnect, Close, or a failed Connect (`why`).
absl::Status Cancellation(const Op& op, const char* why);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_LANE_H_
