#include "engine/transfer/scheduler.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/rows.h"
#include "engine/sync/thread_name.h"
#include "engine/transfer/lane_calls.h"

namespace kvrail::transfer {

using transport::PeerId;
using transport::Write;

namespace {

constexpr uint64_t kDefaultSliceBytes = uint64_t{4} << 20;
constexpr uint64_t kDefaultInflightBytes = uint64_t{64} << 20;
// Copies pulled from a streamed transfer at a time: at first 64, then twice as many each time
// the source filled the last pull, up to 4096 (192 KiB, cache-resident). A transfer of a few
// copies (a small room, a layer of one) then never makes, zeroes and page-faults 192 KiB of
// list: measured, that was 42 % of the CPU of `bench raw --link shm` at 64 KiB x 1.
constexpr size_t kFirstStreamChunk = 64;
constexpr size_t kStreamChunk = 4096;

// The next write of copy `c`, from `offset` bytes of its payload on: a slice of a one-row copy;
// for a strided copy, as many whole rows as `limit` bytes (and the slice) hold, at least one,
// and at most what the transport takes in one write (`caps`, MaxRowsPerWrite), else one row,
// or one slice of a row longer than the slice.
Write NextWrite(const Copy& c, uint64_t offset, uint64_t limit, uint64_t slice,
                const transport::Capabilities& caps, uint64_t remote_base) {
  if (c.rows == 1) {
    return Write{.local_offset = c.src_offset + offset,
                 .remote_address = remote_base + c.dst_offset + offset,
                 .length = std::min(slice, c.length - offset)};
  }
  const uint64_t row = offset / c.length;
  const uint64_t in_row = offset % c.length;
  const uint64_t src = c.src_offset + row * c.src_stride + in_row;
  const uint64_t dst = remote_base + c.dst_offset + row * c.dst_stride + in_row;
  const uint64_t most = transport::MaxRowsPerWrite(caps, c.length, c.dst_stride);
  if (most <= 1 || in_row != 0 || c.length > slice) {
    return Write{
        .local_offset = src, .remote_address = dst, .length = std::min(slice, c.length - in_row)};
  }
  const uint64_t rows =
      std::min({c.rows - row, most, std::max<uint64_t>(1, std::min(slice, limit) / c.length)});
  return Write{.local_offset = src,
               .remote_address = dst,
               .length = c.length,
               .rows = rows,
               .local_stride = c.src_stride,
               .remote_stride = c.dst_stride};
}

struct InFlight : std::enable_shared_from_this<InFlight> {
  Transfer request;
  absl::Time started;
  // The next byte to post: copy index and offset inside that copy.
  size_t next_copy = 0;
  uint64_t next_offset = 0;
  uint64_t posted_bytes = 0;
  uint64_t landed_bytes = 0;  // locally complete; for messages only
  int outstanding = 0;        // batches and flushes posted (or queued to post) and not complete
  std::vector<bool> lane_used;
  bool all_posted = false;
  // Failed (status holds why): nothing new is posted, and the outcome waits for the fence.
  bool fencing = false;
  bool fence_flushed = false;  // the fence's flushes of every lane used were queued
  bool finished = false;       // the outcome is decided (fenced, or landed)
  // Its entry in its stripe's deadlines, while it has one (guarded by the stripe's mu): the
  // transfer's deadline, or once fencing, the end of its fence_timeout.
  bool has_deadline = false;
  std::multimap<absl::Time, std::weak_ptr<InFlight>>::iterator deadline;
  absl::Status status;
  TransferStats stats;
  bool peer_disconnected = false;  // fenced by disconnecting the peer
  bool flush_failed = false;       // a flush of its lanes failed: which writes landed is unknown
  // A streamed transfer (request.stream): request.copies holds the chunk being posted.
  CopyEnvelope envelope;
  bool stream_done = false;
  uint64_t streamed_bytes = 0;
  size_t stream_chunk = kFirstStreamChunk;  // copies the next pull asks for

  bool HasWork() const { return !finished && status.ok() && !all_posted; }
};

// Pulls a streamed transfer's next chunk into request.copies (its caller holds the transfer: q.mu,
// or Submit before the transfer is queued), each copy checked against the envelope Submit checked,
// so no copy outside it is ever posted. At the end the bytes must be the envelope's.
absl::Status PullChunk(InFlight& transfer) {
  CopyList& copies = transfer.request.copies;
  copies.clear();
  const size_t want = transfer.stream_chunk;
  const size_t n = transfer.request.stream->Next(copies.Extend(want), want);
  copies.Truncate(n);
  if (n == want) transfer.stream_chunk = std::min(kStreamChunk, 2 * want);
  transfer.next_copy = 0;
  transfer.next_offset = 0;
  const CopyEnvelope& e = transfer.envelope;
  if (n == 0) {
    transfer.stream_done = true;
    if (transfer.streamed_bytes == e.bytes) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat(
        "transfer %d: its copy source ended after %u bytes, where its envelope said %u",
        transfer.request.transfer_id, transfer.streamed_bytes, e.bytes));
  }
  const auto inside = [](uint64_t offset, uint64_t length, uint64_t begin, uint64_t end) {
    return offset >= begin && offset <= end && length <= end - offset;
  };
  for (size_t i = 0; i < n; ++i) {
    const Copy& c = copies[i];
    RowsMeasure m;
    if (!MeasureRows(c.rows, c.length, c.src_stride, c.dst_stride, &m) ||
        !inside(c.src_offset, m.span_a, e.src_begin, e.src_end) ||
        !inside(c.dst_offset, m.span_b, e.dst_begin, e.dst_end) ||
        m.payload > e.bytes - transfer.streamed_bytes) {
      copies.clear();
      return absl::InternalError(absl::StrFormat(
          "transfer %d: copy %d of its source (%u rows of %u bytes from source offset %u, "
          "stride %u, to destination offset %u, stride %u) lies outside the envelope the source "
          "gave (source [%u, %u), destination [%u, %u), %u bytes); it was not posted",
          transfer.request.transfer_id, transfer.stats.copies + i, c.rows, c.length, c.src_offset,
          c.src_stride, c.dst_offset, c.dst_stride, e.src_begin, e.src_end, e.dst_begin, e.dst_end,
          e.bytes));
    }
    transfer.streamed_bytes += m.payload;
  }
  transfer.stats.copies += n;
  return absl::OkStatus();
}

// A PostWrites or Flush decided and counted under the queue's lock, made outside it.
struct Call {
  bool flush = false;
  std::shared_ptr<InFlight> transfer;
  std::vector<Write> writes;  // !flush
  uint64_t bytes = 0;         // !flush
};

// The transfers and endpoints of one peer. Its lock is never held across transfers of other peers,
// nor while a call is made to the transport: a lane's calls are made by the thread of that
// lane's completions, so lanes post (over shared memory: copy) on several cores at once.
struct PeerQueue {
  std::mutex mu;
  // The scheduler disconnected this peer (a fence that did not drain within fence_timeout):
  // nothing more is posted to it, and fences need no flush.
  bool disconnected = false;
  std::vector<uint64_t> lane_inflight;
  std::vector<LaneCalls<Call>> calls;              // per lane (lane_calls.h)
  std::deque<std::shared_ptr<InFlight>> runnable;  // FIFO: transfers with slices still to post
  // Batches' write vectors whose calls were made, kept with their capacity for the next
  // batches (no allocation per batch once warm); at most kSpareBatches.
  static constexpr size_t kSpareBatches = 64;
  std::vector<std::vector<Write>> spare_batches;
};

// The transfers in flight whose transfer ids fall in one stripe, and their deadlines. Submit,
// Cancel and a transfer's end take only the transfer's stripe: transfers of different stripes (and
// peers) never meet on a lock.
struct TransferStripe {
  std::mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<InFlight>> transfers;
  std::multimap<absl::Time, std::weak_ptr<InFlight>> deadlines;
};
constexpr size_t kStripes = 16;

// An outcome to deliver, with what goes back to the caller with it.
struct Delivery {
  TransferOutcome outcome;
  TransferDone done;
  CopyList copies;
  std::function<void(CopyList)> recycle;
  std::unique_ptr<CopySource> stream;

  // Hands the copies back (or frees them) and calls `done`, with no scheduler lock held.
  void Run() {
    if (recycle) recycle(std::move(copies));
    copies = CopyList();
    stream.reset();
    if (done) done(outcome);
  }
};
using Deliveries = absl::InlinedVector<Delivery, 1>;

}  // namespace

struct Scheduler::Core : std::enable_shared_from_this<Scheduler::Core> {
  transport::Transport* transport = nullptr;
  uint64_t slice = 0;
  uint64_t inflight_cap = 0;
  uint32_t batch_cap = 0;
  int lanes = 1;
  absl::Duration fence_timeout;
  // The transport's: whether a disconnect fences, how many rows one write may carry.
  transport::Capabilities caps;

  // Lock order: peers_mu, a PeerQueue's mu, a TransferStripe's mu, mu. A landed transfer takes its
  // peer's queue and its stripe only; mu is the delivery thread's (failures, deadlines).
  std::array<TransferStripe, kStripes> stripes;
  // Written (a queue added or forgotten) rarely; read by every Submit, never waiting on another.
  mutable std::shared_mutex peers_mu;
  std::map<PeerId, std::unique_ptr<PeerQueue>> peers;
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<Delivery> ready;  // outcomes for the delivery thread (guarded by mu)
  bool dirty = false;          // guarded by mu: a deadline or an outcome came; look again
  // The earliest deadline the delivery thread sleeps until (Unix ns; INT64_MAX while it looks
  // or has none): a transfer with an earlier one wakes it.
  std::atomic<int64_t> next_wake_ns{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> shutdown{false};
  std::atomic<uint64_t> transfers_in_flight{0};
  // Outcomes handed to a completing thread (landed transfers) whose `done` has not returned yet.
  std::atomic<uint64_t> delivering{0};
  // Counted on the posting and completion paths without a lock shared by every transfer.
  std::atomic<uint64_t> writes_posted{0};
  std::atomic<uint64_t> batches_posted{0};
  std::atomic<uint64_t> transfers_ok{0};
  std::atomic<uint64_t> transfers_failed{0};
  std::atomic<uint64_t> transfers_rejected{0};
  std::atomic<uint64_t> bytes_landed{0};
  std::thread delivery;

  // Set by a completion (OnBatchDone, OnFlushDone) while it holds its peer's lock: a transfer that
  // lands there is delivered by that thread once it lets the lock go, not by a hop to the
  // delivery thread. Failures always take the delivery thread.
  static thread_local Deliveries* landed_here;
  struct LandedHere {
    explicit LandedHere(Deliveries* out) { landed_here = out; }
    ~LandedHere() { landed_here = nullptr; }
  };

  TransferStripe& StripeOf(uint64_t transfer_id) {
    return stripes[(transfer_id * 0x9E3779B97F4A7C15ull) >> 60];
  }

  // The queue of `peer`, made on first use (needs peers_mu exclusively).
  PeerQueue& QueueLocked(PeerId peer) {
    auto& queue = peers[peer];
    if (queue == nullptr) {
      queue = std::make_unique<PeerQueue>();
      queue->lane_inflight.assign(lanes, 0);
      queue->calls.resize(lanes);
    }
    return *queue;
  }

  PeerQueue* Queue(PeerId peer) {
    {
      std::shared_lock<std::shared_mutex> lock(peers_mu);
      auto found = peers.find(peer);
      if (found != peers.end()) return found->second.get();
    }
    std::unique_lock<std::shared_mutex> lock(peers_mu);
    return &QueueLocked(peer);
  }

  // The transfers in flight to `peer` (takes each stripe's mu in turn).
  std::vector<std::shared_ptr<InFlight>> TransfersOf(PeerId peer) {
    std::vector<std::shared_ptr<InFlight>> hit;
    for (TransferStripe& stripe : stripes) {
      std::lock_guard<std::mutex> lock(stripe.mu);
      for (auto& [id, transfer] : stripe.transfers) {
        if (transfer->request.peer == peer) hit.push_back(transfer);
      }
    }
    return hit;
  }

  // Wakes the delivery thread: an outcome is ready, or a deadline comes before the one it
  // sleeps until.
  void WakeDelivery() {
    std::lock_guard<std::mutex> lock(mu);
    dirty = true;
    wake.notify_all();
  }
  void WakeFor(absl::Time when) {
    if (absl::ToUnixNanos(when) < next_wake_ns.load()) WakeDelivery();
  }

  // Ends `transfer` with its status (needs q.mu). A landed transfer's outcome is delivered by the
  // completion that landed it (landed_here), any other by the delivery thread.
  void FinishLocked(InFlight& transfer) {
    if (transfer.finished) return;
    transfer.finished = true;
    transfer.stats.duration = absl::Now() - transfer.started;
    TransferOutcome outcome;
    outcome.transfer_id = transfer.request.transfer_id;
    outcome.status = transfer.status;
    outcome.stats = transfer.stats;
    outcome.peer_disconnected = transfer.peer_disconnected;
    outcome.fence_proven = transfer.status.ok() || caps.disconnect_fences ||
                           (!transfer.peer_disconnected && !transfer.flush_failed);
    if (transfer.status.ok()) {
      transfers_ok.fetch_add(1, std::memory_order_relaxed);
      bytes_landed.fetch_add(transfer.stats.bytes, std::memory_order_relaxed);
    } else {
      transfers_failed.fetch_add(1, std::memory_order_relaxed);
    }
    // The copies go now, not at the transfer's last completion: back to the caller, or freed,
    // outside every lock (a large list's free unmaps it).
    Delivery delivery{std::move(outcome), std::move(transfer.request.done),
                      std::move(transfer.request.copies), std::move(transfer.request.recycle),
                      std::move(transfer.request.stream)};
    transfer.request.copies = CopyList();
    {  // out of the table before `done` can run: the caller may reuse the id from there
      TransferStripe& stripe = StripeOf(transfer.request.transfer_id);
      std::lock_guard<std::mutex> lock(stripe.mu);
      stripe.transfers.erase(transfer.request.transfer_id);
      if (transfer.has_deadline) {
        stripe.deadlines.erase(transfer.deadline);
        transfer.has_deadline = false;
      }
    }
    // The transfer leaves the count before `done` can run, and never before its outcome is counted
    // where the delivery thread's exit looks (delivering, or ready under mu).
    if (transfer.status.ok() && landed_here != nullptr) {
      delivering.fetch_add(1);
      transfers_in_flight.fetch_sub(1);
      landed_here->push_back(std::move(delivery));
    } else {
      std::lock_guard<std::mutex> lock(mu);
      transfers_in_flight.fetch_sub(1);
      ready.push_back(std::move(delivery));
      dirty = true;
      wake.notify_all();
    }
  }

  // Runs the outcomes a completion landed, with no lock held.
  void DeliverLanded(Deliveries& landed) {
    for (Delivery& delivery : landed) {
      delivery.Run();
      if (delivering.fetch_sub(1) == 1 && shutdown.load()) WakeDelivery();
    }
    landed.clear();
  }

  // Sets (or moves) `transfer`'s deadline entry to `when` (takes its stripe's mu).
  void SetDeadline(InFlight& transfer, absl::Time when) {
    {
      TransferStripe& stripe = StripeOf(transfer.request.transfer_id);
      std::lock_guard<std::mutex> lock(stripe.mu);
      if (transfer.has_deadline) stripe.deadlines.erase(transfer.deadline);
      transfer.deadline = stripe.deadlines.emplace(when, transfer.weak_from_this());
      transfer.has_deadline = true;
    }
    WakeFor(when);
  }

  // Fails `transfer` with `status` unless it already failed or ended (needs q.mu): nothing more of
  // it is posted, its calls not yet made are dropped, and its outcome waits for the fence
  // (MaybeFencedLocked). The caller makes the calls this queues (SendLocked).
  void FailLocked(PeerQueue& q, InFlight& transfer, absl::Status status) {
    if (transfer.finished || transfer.fencing) return;
    transfer.status = std::move(status);
    transfer.fencing = true;
    q.runnable.erase(
        std::remove_if(q.runnable.begin(), q.runnable.end(),
                       [&](const std::shared_ptr<InFlight>& r) { return r.get() == &transfer; }),
        q.runnable.end());
    for (int lane = 0; lane < lanes; ++lane) {
      std::vector<Call>& queued = q.calls[lane].queued;
      size_t kept = 0;
      for (size_t i = 0; i < queued.size(); ++i) {
        if (queued[i].transfer.get() == &transfer) {
          UndoLocked(q, lane, queued[i]);
          continue;
        }
        if (kept != i) queued[kept] = std::move(queued[i]);
        ++kept;
      }
      queued.resize(kept);
    }
    SetDeadline(transfer, absl::Now() + fence_timeout);
    MaybeFencedLocked(q, transfer);
  }

  // Failed means fenced (needs q.mu): once every call made for a failing transfer has completed, a
  // flush of each lane it wrote on is queued, and once those complete (OK: its writes landed;
  // an error: the backend's lane failed and none of them lands later), or the peer was
  // disconnected, no write of the transfer can land any more and its outcome goes out.
  void MaybeFencedLocked(PeerQueue& q, InFlight& transfer) {
    if (transfer.finished || !transfer.fencing || transfer.outstanding > 0) return;
    if (!transfer.fence_flushed && !q.disconnected && transfer.posted_bytes > 0) {
      transfer.fence_flushed = true;
      std::shared_ptr<InFlight> held = transfer.shared_from_this();
      for (int lane = 0; lane < lanes; ++lane) {
        if (!transfer.lane_used[lane]) continue;
        ++transfer.outstanding;
        q.calls[lane].queued.push_back(Call{true, held, {}, 0});
      }
      if (transfer.outstanding > 0) return;
    }
    if (q.disconnected) transfer.peer_disconnected = true;
    FinishLocked(transfer);
  }

  void MaybeCompleteLocked(InFlight& transfer) {
    if (!transfer.finished && !transfer.fencing && transfer.all_posted &&
        transfer.outstanding == 0) {
      FinishLocked(transfer);
    }
  }

  // Whether `lane` may take `bytes` more (an idle lane takes any batch).
  bool Fits(const PeerQueue& q, int lane, uint64_t bytes) const {
    const uint64_t inflight = q.lane_inflight[lane];
    return inflight == 0 || inflight + bytes <= inflight_cap;
  }

  // The lane for batch `batch` (0-based) of a transfer on lanes `set`, which may take `bytes`
  // more, or -1 when none of `set` may: where a lane shares passes over the rows of several peers'
  // batches (Capabilities::lanes_share_rows), the set's lane batch % (its size) when it may, so
  // that transfers cut alike put their k-th batches on one lane; else, or when that lane is full,
  // the lane of `set` with the fewest bytes in flight that may.
  int PickLane(const PeerQueue& q, uint64_t bytes, const LaneSet& set, uint64_t batch) const {
    if (caps.lanes_share_rows) {
      const int placed =
          set.first +
          static_cast<int>(batch % static_cast<uint64_t>(set.CountIn(lanes))) * set.step;
      if (Fits(q, placed, bytes)) return placed;
    }
    int best = -1;
    for (int lane = set.first; lane < lanes; lane += set.step) {
      if (Fits(q, lane, bytes) && (best < 0 || q.lane_inflight[lane] < q.lane_inflight[best])) {
        best = lane;
      }
    }
    return best;
  }

  // Posts as much of `peer`'s queued work as the in-flight bound allows, or `max_batches`
  // batches of it (needs q.mu).
  void PumpLocked(PeerId peer, PeerQueue& q,
                  size_t max_batches = std::numeric_limits<size_t>::max()) {
    for (size_t batches = 0; batches < max_batches && !q.runnable.empty();) {
      std::shared_ptr<InFlight> transfer = q.runnable.front();
      if (!transfer->HasWork()) {
        q.runnable.pop_front();
        continue;
      }
      const CopyList& copies = transfer->request.copies;
      const uint64_t remote_base = transfer->request.remote_base;
      const uint64_t first_len = PayloadBytes(NextWrite(
          copies[transfer->next_copy], transfer->next_offset, slice, slice, caps, remote_base));
      const int lane = PickLane(q, first_len, transfer->request.lanes, transfer->stats.batches);
      if (lane < 0) return;  // every lane is full: a completion pumps again
      // A transfer smaller than the lanes' bounds together is cut so that every lane carries a
      // share of it: one layer of a layer-wise room (16 MiB) would otherwise be one batch on one
      // lane, and the room's last layer would take twice the time it needs.
      const uint64_t its_lanes = transfer->request.lanes.CountIn(lanes);
      const uint64_t share = std::max(slice, (transfer->stats.bytes + its_lanes - 1) / its_lanes);
      const uint64_t budget =
          std::min(share, q.lane_inflight[lane] == 0 ? std::max(inflight_cap, first_len)
                                                     : inflight_cap - q.lane_inflight[lane]);
      std::vector<Write> batch;
      if (!q.spare_batches.empty()) {
        batch = std::move(q.spare_batches.back());
        q.spare_batches.pop_back();
      } else {
        batch.reserve(std::min<size_t>(batch_cap, copies.size() - transfer->next_copy));
      }
      uint64_t bytes = 0;
      size_t copy = transfer->next_copy;
      uint64_t offset = transfer->next_offset;
      // A batch holds at most batch_cap rows (a strided write's rows count one by one), so a
      // batch of head-sliced pages is no larger than the same rows written one by one were:
      // the lane that posts it completes, and the next batch is decided, as often.
      uint64_t rows = 0;
      while (copy < copies.size() && rows < batch_cap) {
        const Copy& c = copies[copy];
        const uint64_t room_left = batch.empty() ? budget : budget - std::min(budget, bytes);
        const Write w = NextWrite(c, offset, std::min(room_left, (batch_cap - rows) * c.length),
                                  slice, caps, remote_base);
        const uint64_t length = PayloadBytes(w);
        if (!batch.empty() && bytes + length > budget) break;
        batch.push_back(w);
        rows += w.rows;
        bytes += length;
        offset += length;
        if (offset == PayloadBytes(c)) {
          ++copy;
          offset = 0;
        }
      }
      transfer->next_copy = copy;
      transfer->next_offset = offset;
      transfer->posted_bytes += bytes;
      ++transfer->outstanding;
      transfer->lane_used[lane] = true;
      transfer->stats.writes += batch.size();
      ++transfer->stats.batches;
      q.lane_inflight[lane] += bytes;
      writes_posted.fetch_add(batch.size(), std::memory_order_relaxed);
      batches_posted.fetch_add(1, std::memory_order_relaxed);
      q.calls[lane].queued.push_back(Call{false, transfer, std::move(batch), bytes});
      ++batches;
      if (copy == copies.size() && !MoreCopiesLocked(q, *transfer)) {
        // A stream that broke its envelope failed the transfer, which left `runnable` then.
        if (!transfer->status.ok()) continue;
        q.runnable.pop_front();
        transfer->all_posted = true;
        FlushLocked(q, transfer);
      }
    }
  }

  // A list's copies are all posted, or a stream's chunk is: pulls the stream's next chunk
  // (needs q.mu). False when there is none: a list, the stream's end, or a chunk that broke
  // the envelope (the transfer fails, with what it posted fenced).
  bool MoreCopiesLocked(PeerQueue& q, InFlight& transfer) {
    if (!transfer.request.stream || transfer.stream_done) return false;
    absl::Status pulled = PullChunk(transfer);
    if (!pulled.ok()) {
      FailLocked(q, transfer, std::move(pulled));
      return false;
    }
    return !transfer.stream_done;
  }

  // Success means landed: flush every lane the transfer wrote on (needs q.mu).
  void FlushLocked(PeerQueue& q, const std::shared_ptr<InFlight>& transfer) {
    for (int lane = 0; lane < lanes; ++lane) {
      if (!transfer->lane_used[lane]) continue;
      ++transfer->stats.lanes_used;
      ++transfer->outstanding;
      q.calls[lane].queued.push_back(Call{true, transfer, {}, 0});
    }
    MaybeCompleteLocked(*transfer);
  }

  // Takes back what queuing `call` counted, for a call that never reached the transport.
  void UndoLocked(PeerQueue& q, int lane, const Call& call) {
    InFlight& transfer = *call.transfer;
    --transfer.outstanding;
    if (call.flush) {
      if (!transfer.fencing) --transfer.stats.lanes_used;
      return;
    }
    q.lane_inflight[lane] -= call.bytes;
    transfer.posted_bytes -= call.bytes;
    transfer.stats.writes -= call.writes.size();
    --transfer.stats.batches;
    writes_posted.fetch_sub(call.writes.size(), std::memory_order_relaxed);
    batches_posted.fetch_sub(1, std::memory_order_relaxed);
  }

  absl::Status Issue(PeerId peer, PeerQueue& q, int lane, const Call& call) {
    std::weak_ptr<Core> weak = weak_from_this();
    std::shared_ptr<InFlight> held = call.transfer;
    // Stable: a queue is erased only by ForgetPeer, once no call of it is live.
    PeerQueue* queue = &q;
    if (call.flush) {
      return transport->Flush(peer, lane, [weak, held, queue, peer, lane](absl::Status status) {
        if (auto core = weak.lock()) core->OnFlushDone(*queue, peer, lane, *held, status);
      });
    }
    const uint64_t bytes = call.bytes;
    const uint64_t writes = call.writes.size();
    if (held->request.on_batch) held->request.on_batch({lane, bytes, writes, false, false});
    return transport->PostWrites(
        peer, lane, held->request.source, call.writes,
        [weak, held, queue, peer, lane, bytes, writes](absl::Status status) {
          if (held->request.on_batch) {
            held->request.on_batch({lane, bytes, writes, true, status.ok()});
          }
          if (auto core = weak.lock()) core->OnBatchDone(*queue, peer, lane, bytes, *held, status);
        });
  }

  // Makes the queued calls to `peer` (SendLaneCalls): calls of transfers that ended meanwhile are
  // dropped, and a refused call fails its transfer.
  void SendLocked(std::unique_lock<std::mutex>& lock, PeerId peer, PeerQueue& q, int self) {
    struct Hooks {
      Core& core;
      PeerId peer;
      PeerQueue& q;
      bool Keep(const Call& call) { return !call.transfer->finished; }
      void Undo(int lane, const Call& call) { core.UndoLocked(q, lane, call); }
      void Taking(const Call&) {}
      void Taken(Call& call) {
        if (call.flush || q.spare_batches.size() >= PeerQueue::kSpareBatches) return;
        call.writes.clear();
        q.spare_batches.push_back(std::move(call.writes));
      }
      absl::Status Issue(int lane, const Call& call) { return core.Issue(peer, q, lane, call); }
      void Failed(int /*lane*/, Call& call, absl::Status status) {
        InFlight& transfer = *call.transfer;
        if (call.flush) transfer.flush_failed = true;
        core.FailLocked(q, transfer,
                        absl::Status(status.code(),
                                     absl::StrCat("transfer ", transfer.request.transfer_id,
                                                  call.flush ? ": flush: " : ": posting writes: ",
                                                  status.message())));
        core.MaybeFencedLocked(q, transfer);  // a refused fence flush: nothing of it is in flight
      }
    } hooks{*this, peer, q};
    SendLaneCalls(lock, q.calls, self, hooks);
  }

  void OnBatchDone(PeerQueue& queue, PeerId peer, int lane, uint64_t bytes, InFlight& transfer,
                   const absl::Status& status) {
    Deliveries landed;
    {
      LandedHere here(&landed);
      std::unique_lock<std::mutex> lock(queue.mu);
      BatchDoneLocked(lock, queue, peer, lane, bytes, transfer, status);
    }
    DeliverLanded(landed);
  }

  void BatchDoneLocked(std::unique_lock<std::mutex>& lock, PeerQueue& queue, PeerId peer, int lane,
                       uint64_t bytes, InFlight& transfer, const absl::Status& status) {
    PeerQueue* q = &queue;
    --q->calls[lane].live;
    q->lane_inflight[lane] -= bytes;
    --transfer.outstanding;
    transfer.landed_bytes += bytes;
    if (!status.ok()) {
      FailLocked(
          *q, transfer,
          absl::Status(status.code(),
                       absl::StrFormat("transfer %d: writes on lane %d failed after %d of "
                                       "%d bytes: %s",
                                       transfer.request.transfer_id, lane, transfer.landed_bytes,
                                       transfer.stats.bytes, status.message())));
    } else {
      MaybeCompleteLocked(transfer);
    }
    MaybeFencedLocked(*q, transfer);
    if (!shutdown.load()) PumpLocked(peer, *q);
    SendLocked(lock, peer, *q, lane);
  }

  void OnFlushDone(PeerQueue& queue, PeerId peer, int lane, InFlight& transfer,
                   const absl::Status& status) {
    Deliveries landed;
    {
      LandedHere here(&landed);
      std::unique_lock<std::mutex> lock(queue.mu);
      FlushDoneLocked(lock, queue, peer, lane, transfer, status);
    }
    DeliverLanded(landed);
  }

  void FlushDoneLocked(std::unique_lock<std::mutex>& lock, PeerQueue& queue, PeerId peer, int lane,
                       InFlight& transfer, const absl::Status& status) {
    PeerQueue* q = &queue;
    --q->calls[lane].live;
    --transfer.outstanding;
    if (!status.ok()) {
      transfer.flush_failed = true;
      FailLocked(
          *q, transfer,
          absl::Status(status.code(),
                       absl::StrFormat("transfer %d: flush of lane %d failed: %s",
                                       transfer.request.transfer_id, lane, status.message())));
    } else {
      MaybeCompleteLocked(transfer);
    }
    MaybeFencedLocked(*q, transfer);
    SendLocked(lock, peer, *q, lane);
  }

  // A transfer's deadline passed: a transfer still moving fails (and starts fencing); a transfer
  // whose fence did not drain within fence_timeout has its peer disconnected.
  void Expire(const std::shared_ptr<InFlight>& transfer) {
    const PeerId peer = transfer->request.peer;
    PeerQueue* q = Queue(peer);
    std::unique_lock<std::mutex> lock(q->mu);
    if (transfer->finished) return;
    if (!transfer->fencing) {
      FailLocked(
          *q, *transfer,
          absl::DeadlineExceededError(absl::StrFormat(
              "transfer %d: deadline passed after %s with %d of %d bytes posted and "
              "%d locally complete; the peer may be gone",
              transfer->request.transfer_id, absl::FormatDuration(absl::Now() - transfer->started),
              transfer->posted_bytes, transfer->stats.bytes, transfer->landed_bytes)));
      SendLocked(lock, peer, *q, -1);
      return;
    }
    transfer->status = absl::Status(
        transfer->status.code(),
        absl::StrFormat("%s; its writes did not drain within the fence timeout of %s, so peer %d "
                        "was disconnected (%s)",
                        transfer->status.message(), absl::FormatDuration(fence_timeout), peer,
                        caps.disconnect_fences
                            ? "nothing it carried lands any more"
                            : "writes this transport had already handed over may still land"));
    DisconnectLocked(lock, peer, *q);
  }

  // Fences every transfer of `peer` at once by disconnecting it (needs q.mu, released for the
  // call): the transport fails whatever it still holds for the peer with kCancelled, and nothing of
  // it lands afterwards (Transport::Disconnect). Transfers still moving fail with `why`.
  void DisconnectLocked(std::unique_lock<std::mutex>& lock, PeerId peer, PeerQueue& q,
                        const absl::Status& why = absl::OkStatus()) {
    if (q.disconnected) return;
    q.disconnected = true;
    const std::vector<std::shared_ptr<InFlight>> hit = TransfersOf(peer);
    for (const auto& transfer : hit) {
      FailLocked(q, *transfer,
                 why.ok() ? absl::UnavailableError(absl::StrFormat(
                                "transfer %d: peer %d was disconnected: a transfer to it did not "
                                "drain within the fence timeout",
                                transfer->request.transfer_id, peer))
                          : absl::Status(why.code(), absl::StrFormat("transfer %d: %s",
                                                                     transfer->request.transfer_id,
                                                                     why.message())));
    }
    lock.unlock();
    const absl::Status disconnected = transport->Disconnect(peer);
    lock.lock();
    // NotFound: someone else disconnected it first; either way nothing of it lands any more.
    (void)disconnected;
    for (const auto& transfer : hit) MaybeFencedLocked(q, *transfer);
  }

  // Fails transfers whose deadline passed, then delivers outcomes; until shutdown and drained.
  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      while (!ready.empty()) {
        Delivery delivery = std::move(ready.front());
        ready.pop_front();
        lock.unlock();
        delivery.Run();
        lock.lock();
      }
      dirty = false;
      lock.unlock();
      // While it looks, every new deadline wakes it (next_wake_ns is the largest): one set
      // after it looked at that stripe is not missed.
      next_wake_ns.store(std::numeric_limits<int64_t>::max());
      const absl::Time now = absl::Now();
      absl::Time earliest = absl::InfiniteFuture();
      std::vector<std::shared_ptr<InFlight>> expired;
      for (TransferStripe& stripe : stripes) {
        std::lock_guard<std::mutex> stripe_lock(stripe.mu);
        while (!stripe.deadlines.empty() && stripe.deadlines.begin()->first <= now) {
          if (auto transfer = stripe.deadlines.begin()->second.lock()) {
            transfer->has_deadline = false;
            expired.push_back(std::move(transfer));
          }
          stripe.deadlines.erase(stripe.deadlines.begin());
        }
        if (!stripe.deadlines.empty())
          earliest = std::min(earliest, stripe.deadlines.begin()->first);
      }
      if (earliest != absl::InfiniteFuture()) next_wake_ns.store(absl::ToUnixNanos(earliest));
      if (!expired.empty()) {
        for (const auto& transfer : expired) Expire(transfer);
        lock.lock();
        continue;
      }
      lock.lock();
      if (shutdown && transfers_in_flight.load() == 0 && ready.empty() && delivering.load() == 0) {
        return;
      }
      if (!ready.empty() || dirty) continue;
      if (earliest == absl::InfiniteFuture()) {
        wake.wait(lock);
      } else {
        const absl::Duration left = earliest - absl::Now();
        wake.wait_for(lock, absl::ToChronoNanoseconds(std::max(left, absl::Nanoseconds(1))));
      }
    }
  }
};

thread_local Deliveries* Scheduler::Core::landed_here = nullptr;

Scheduler::Scheduler(transport::Transport* transport, SchedulerOptions options)
    : core_(std::make_shared<Core>()) {
  const transport::Capabilities& caps = transport->capabilities();
  core_->transport = transport;
  const uint64_t max_write =
      caps.max_write_bytes == 0 ? std::numeric_limits<uint64_t>::max() : caps.max_write_bytes;
  core_->slice = options.slice_bytes == 0 ? std::min(kDefaultSliceBytes, max_write)
                                          : std::min(options.slice_bytes, max_write);
  core_->inflight_cap =
      options.max_inflight_bytes_per_endpoint != 0 ? options.max_inflight_bytes_per_endpoint
      : caps.max_inflight_bytes_per_endpoint != 0  ? caps.max_inflight_bytes_per_endpoint
                                                   : kDefaultInflightBytes;
  core_->batch_cap = std::max<uint32_t>(1, options.max_writes_per_batch);
  core_->lanes = std::max(1, caps.lanes);
  core_->fence_timeout = options.fence_timeout;
  core_->caps = caps;
  core_->delivery = std::thread([core = core_.get()] { core->Run(); });
  NameThread(core_->delivery, "kvrail-sched");
}

Scheduler::~Scheduler() {
  std::set<PeerId> peers;
  core_->shutdown = true;  // before the stripes are read: a Submit after that is refused
  for (TransferStripe& stripe : core_->stripes) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (auto& [id, transfer] : stripe.transfers) peers.insert(transfer->request.peer);
  }
  // Shutting down fences by disconnecting: waiting for a slow peer to drain has no one to serve.
  for (PeerId peer : peers) {
    PeerQueue* q = core_->Queue(peer);
    std::unique_lock<std::mutex> lock(q->mu);
    core_->DisconnectLocked(lock, peer, *q, absl::CancelledError("the scheduler shut down"));
  }
  core_->WakeDelivery();
  core_->delivery.join();
  // Completions of writes still inside the transport hold only weak references to the core.
}

namespace {

// OK when every offset of `e` lies inside the transfer's bounds: the source region, one of the
// peer's regions, and the destination's arena when it has a length; else InvalidArgument naming
// the side that does not. An envelope of no copies is inside.
absl::Status CheckEnvelope(const Transfer& request, const CopyEnvelope& e,
                           const std::string& context) {
  if (e.copies == 0) return absl::OkStatus();
  if (e.src_begin > e.src_end || e.src_end > request.source_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: its copies' source range [%u, %u) lies outside the source region's %u bytes; "
        "nothing was written",
        context, e.src_begin, e.src_end, request.source_length));
  }
  const uint64_t address = request.remote_base + e.dst_begin;
  if (e.dst_begin > e.dst_end || address < request.remote_base ||
      !request.remote->Find(address, e.dst_end - e.dst_begin).has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: its copies' destination range, base 0x%x + [%u, %u), lies inside none of the "
        "peer's %d registered regions; nothing was written",
        context, request.remote_base, e.dst_begin, e.dst_end, request.remote->size()));
  }
  if (request.remote_length > 0 && e.dst_end > request.remote_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: its copies' destination range [%u, %u) lies outside the destination's arena of %u "
        "bytes at 0x%x; nothing was written",
        context, e.dst_begin, e.dst_end, request.remote_length, request.remote_base));
  }
  return absl::OkStatus();
}

// The payload bytes of a transfer whose copies all lie inside their bounds (the source region;
// one of the peer's regions; the destination's arena when it has a length), or InvalidArgument
// naming the first copy that does not. First the transfer's envelope, in one pass without a lookup
// per copy (a head-sliced transfer is half a million copies): when the lowest and highest offsets
// on each side lie inside, so does every copy. Only a transfer whose envelope does not is checked
// copy by copy, to name the copy.
absl::StatusOr<uint64_t> CheckedBytes(const Transfer& request, const std::string& context) {
  CopyEnvelope e{UINT64_MAX, 0, UINT64_MAX, 0, 0, request.copies.size()};
  bool wraps = false;
  for (const Copy& c : request.copies) {
    RowsMeasure m;
    const bool measured = MeasureRows(c.rows, c.length, c.src_stride, c.dst_stride, &m);
    const uint64_t src_end = c.src_offset + m.span_a;
    const uint64_t dst_end = c.dst_offset + m.span_b;
    wraps |= !measured | (src_end < c.src_offset) | (dst_end < c.dst_offset);
    e.src_begin = std::min(e.src_begin, c.src_offset);
    e.src_end = std::max(e.src_end, src_end);
    e.dst_begin = std::min(e.dst_begin, c.dst_offset);
    e.dst_end = std::max(e.dst_end, dst_end);
    e.bytes += m.payload;
  }
  if (!wraps && CheckEnvelope(request, e, context).ok()) return e.bytes;
  uint64_t total = 0;
  for (size_t i = 0; i < request.copies.size(); ++i) {
    const Copy& c = request.copies[i];
    RowsMeasure m;
    if (!MeasureRows(c.rows, c.length, c.src_stride, c.dst_stride, &m)) {
      const std::string rule = c.length == 0 ? "has length 0"
                               : c.rows == 0 ? "has 0 rows"
                               : c.src_stride < c.length || c.dst_stride < c.length
                                   ? "has rows that overlap (a stride below the row length)"
                                   : "reaches past 2^64";
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d %s: %u rows of %u bytes at strides %u (source) and "
          "%u (destination); nothing was written",
          context, i, request.copies.size(), rule, c.rows, c.length, c.src_stride, c.dst_stride));
    }
    if (!transport::RangeInside(c.src_offset, m.span_a, 0, request.source_length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d: source [%u, +%u) lies outside the source region's %u bytes; "
          "nothing was written",
          context, i, request.copies.size(), c.src_offset, m.span_a, request.source_length));
    }
    const uint64_t address = request.remote_base + c.dst_offset;
    if (address < request.remote_base || !request.remote->Find(address, m.span_b).has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d: destination base 0x%x + offset %u, %u bytes, lies inside none of "
          "the peer's %d registered regions; nothing was written",
          context, i, request.copies.size(), request.remote_base, c.dst_offset, m.span_b,
          request.remote->size()));
    }
    if (request.remote_length > 0 &&
        !transport::RangeInside(c.dst_offset, m.span_b, 0, request.remote_length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d: destination offset %u, %u bytes, lies outside the destination's "
          "arena of %u bytes at 0x%x; nothing was written",
          context, i, request.copies.size(), c.dst_offset, m.span_b, request.remote_length,
          request.remote_base));
    }
    total += m.payload;
  }
  return total;
}

// The payload bytes of a streamed transfer whose envelope lies inside the bounds CheckedBytes
// checks each copy against, or InvalidArgument naming the side that does not.
absl::StatusOr<uint64_t> CheckedEnvelope(const Transfer& request, const std::string& context) {
  if (!request.copies.empty()) {
    return absl::InvalidArgumentError(context +
                                      ": both a copy list and a copy source were given; give one");
  }
  const CopyEnvelope e = request.stream->envelope();
  if (absl::Status inside = CheckEnvelope(request, e, context); !inside.ok()) return inside;
  return e.bytes;
}

}  // namespace

absl::Status Scheduler::Submit(Transfer request) {
  const std::string context = absl::StrCat("transfer ", request.transfer_id);
  if (!request.done) return absl::InvalidArgumentError(context + ": the completion is empty");
  if (request.remote == nullptr) {
    return absl::InvalidArgumentError(context + ": the peer's regions are missing");
  }
  auto reject = [&](absl::Status status) {
    core_->transfers_rejected.fetch_add(1, std::memory_order_relaxed);
    return status;
  };
  const LaneSet& lanes = request.lanes;
  if (lanes.CountIn(core_->lanes) == 0) {
    return reject(absl::InvalidArgumentError(absl::StrFormat(
        "%s: its lanes (from lane %d, every %d) hold none of the transport's %d lanes (the "
        "first must be 0 to %d, the step at least 1); nothing was written",
        context, lanes.first, lanes.step, core_->lanes, core_->lanes - 1)));
  }
  // Bounds before bytes: the whole transfer, before anything is posted.
  const bool streamed = request.stream != nullptr;
  absl::StatusOr<uint64_t> total =
      streamed ? CheckedEnvelope(request, context) : CheckedBytes(request, context);
  if (!total.ok()) return reject(total.status());
  auto transfer = std::make_shared<InFlight>();
  transfer->started = absl::Now();
  transfer->lane_used.assign(core_->lanes, false);
  transfer->stats.bytes = *total;
  transfer->stats.copies = request.copies.size();
  if (streamed) transfer->envelope = request.stream->envelope();
  transfer->request = std::move(request);
  if (streamed) {  // the first chunk, so that the transfer has copies when it is queued
    if (absl::Status pulled = PullChunk(*transfer); !pulled.ok()) {
      return reject(
          absl::InvalidArgumentError(absl::StrCat(pulled.message(), "; nothing was written")));
    }
  }
  const uint64_t id = transfer->request.transfer_id;
  const PeerId peer = transfer->request.peer;
  PeerQueue* q = nullptr;
  {
    // The transfer enters its stripe while the peer's queue is held (shared): ForgetPeer, which
    // takes peers_mu exclusively, then sees the transfer and keeps the queue.
    std::shared_lock<std::shared_mutex> shared(core_->peers_mu);
    std::unique_lock<std::shared_mutex> exclusive;
    if (auto found = core_->peers.find(peer); found != core_->peers.end()) {
      q = found->second.get();
    } else {
      shared.unlock();
      exclusive = std::unique_lock<std::shared_mutex>(core_->peers_mu);
      q = &core_->QueueLocked(peer);
    }
    TransferStripe& stripe = core_->StripeOf(id);
    std::lock_guard<std::mutex> lock(stripe.mu);
    // Read under the stripe's mu, which the destructor takes after setting it: a transfer that
    // gets in is one the destructor finds.
    if (core_->shutdown) {
      return absl::FailedPreconditionError(context + ": the scheduler is shut down");
    }
    if (!stripe.transfers.emplace(id, transfer).second) {
      core_->transfers_rejected.fetch_add(1, std::memory_order_relaxed);
      return absl::AlreadyExistsError(context + ": a transfer with this id is in flight");
    }
    core_->transfers_in_flight.fetch_add(1);
    if (transfer->request.deadline != absl::InfiniteFuture()) {
      transfer->deadline = stripe.deadlines.emplace(transfer->request.deadline, transfer);
      transfer->has_deadline = true;
    }
  }
  if (transfer->request.deadline != absl::InfiniteFuture())
    core_->WakeFor(transfer->request.deadline);
  std::unique_lock<std::mutex> lock(q->mu);
  if (q->disconnected) {
    core_->FailLocked(*q, *transfer,
                      absl::UnavailableError(absl::StrFormat(
                          "%s: peer %d was disconnected after a fence timeout; connect it again",
                          context, transfer->request.peer)));
    return absl::OkStatus();  // the outcome says why, like any failure after Submit
  }
  if (transfer->request.copies.empty()) {
    transfer->all_posted = true;
    core_->FinishLocked(*transfer);
    return absl::OkStatus();
  }
  q->runnable.push_back(transfer);
  // The first byte first: one batch per lane goes out before the rest of the in-flight bound
  // is filled (for 1 KiB rows that is hundreds of batches and a dozen chunks of the stream,
  // 3 ms of work here before the first write left); the lanes' completions send the rest.
  core_->PumpLocked(peer, *q, static_cast<size_t>(core_->lanes));
  core_->SendLocked(lock, peer, *q, -1);
  core_->PumpLocked(peer, *q);
  core_->SendLocked(lock, peer, *q, -1);
  return absl::OkStatus();
}

absl::Status Scheduler::Cancel(uint64_t transfer_id, absl::string_view why) {
  std::shared_ptr<InFlight> transfer;
  {
    TransferStripe& stripe = core_->StripeOf(transfer_id);
    std::lock_guard<std::mutex> lock(stripe.mu);
    auto it = stripe.transfers.find(transfer_id);
    if (it == stripe.transfers.end()) {
      return absl::NotFoundError(
          absl::StrFormat("transfer %d is not in flight (unknown or already done)", transfer_id));
    }
    transfer = it->second;
  }
  const PeerId peer = transfer->request.peer;
  PeerQueue* q = core_->Queue(peer);
  std::unique_lock<std::mutex> lock(q->mu);
  if (transfer->finished || transfer->fencing) {
    return absl::NotFoundError(absl::StrFormat("transfer %d already completed", transfer_id));
  }
  core_->FailLocked(*q, *transfer,
                    absl::CancelledError(absl::StrFormat("transfer %d: %s", transfer_id, why)));
  core_->SendLocked(lock, peer, *q, -1);
  return absl::OkStatus();
}

void Scheduler::FailPeer(transport::PeerId peer, const absl::Status& status) {
  const std::vector<std::shared_ptr<InFlight>> hit = core_->TransfersOf(peer);
  PeerQueue* q = core_->Queue(peer);
  std::unique_lock<std::mutex> lock(q->mu);
  for (const auto& transfer : hit) {
    core_->FailLocked(*q, *transfer,
                      absl::Status(status.code(),
                                   absl::StrFormat("transfer %d: %s", transfer->request.transfer_id,
                                                   status.message())));
  }
  core_->SendLocked(lock, peer, *q, -1);
}

bool Scheduler::ForgetPeer(transport::PeerId peer) {
  // Exclusively: no Submit is between finding the queue and entering its transfer in a stripe.
  std::unique_lock<std::shared_mutex> lock(core_->peers_mu);
  auto found = core_->peers.find(peer);
  if (found == core_->peers.end()) return true;
  if (!core_->TransfersOf(peer).empty()) return false;
  PeerQueue& q = *found->second;
  {
    // A queue with calls live or being made keeps its lock busy or its counts non-zero, so
    // try_lock and the counts together decide.
    std::unique_lock<std::mutex> queue_lock(q.mu, std::try_to_lock);
    if (!queue_lock.owns_lock() || !q.runnable.empty()) return false;
    for (const LaneCalls<Call>& lane : q.calls) {
      if (lane.live > 0 || lane.sending || !lane.queued.empty()) return false;
    }
  }
  core_->peers.erase(found);  // no completion can name it any more
  return true;
}

size_t Scheduler::peers() const {
  std::shared_lock<std::shared_mutex> lock(core_->peers_mu);
  return core_->peers.size();
}

uint64_t Scheduler::slice_bytes() const { return core_->slice; }
uint64_t Scheduler::max_inflight_bytes_per_endpoint() const { return core_->inflight_cap; }

uint64_t Scheduler::transfers_in_flight() const { return core_->transfers_in_flight.load(); }

SchedulerStats Scheduler::stats() const {
  SchedulerStats stats;
  stats.transfers_ok = core_->transfers_ok.load(std::memory_order_relaxed);
  stats.transfers_failed = core_->transfers_failed.load(std::memory_order_relaxed);
  stats.transfers_rejected = core_->transfers_rejected.load(std::memory_order_relaxed);
  stats.bytes_landed = core_->bytes_landed.load(std::memory_order_relaxed);
  stats.writes = core_->writes_posted.load(std::memory_order_relaxed);
  stats.batches = core_->batches_posted.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace kvrail::transfer
