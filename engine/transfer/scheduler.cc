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
#include "engine/sync/thread_name.h"
#include "engine/transfer/lane_calls.h"

namespace kvrail::transfer {

using transport::PeerId;
using transport::Write;

namespace {

constexpr uint64_t kDefaultSliceBytes = uint64_t{4} << 20;
constexpr uint64_t kDefaultInflightBytes = uint64_t{64} << 20;
// Copies pulled from a streamed room at a time: 96 KiB, cache-resident.
constexpr size_t kStreamChunk = 4096;

struct Room : std::enable_shared_from_this<Room> {
  RoomTransfer request;
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
  // room's deadline, or once fencing, the end of its fence_timeout.
  bool has_deadline = false;
  std::multimap<absl::Time, std::weak_ptr<Room>>::iterator deadline;
  absl::Status status;
  RoomStats stats;
  bool peer_disconnected = false;  // fenced by disconnecting the peer
  bool flush_failed = false;       // a flush of its lanes failed: which writes landed is unknown
  // A streamed room (request.stream): request.copies holds the chunk being posted.
  CopyEnvelope envelope;
  bool stream_done = false;
  uint64_t streamed_bytes = 0;

  bool HasWork() const { return !finished && status.ok() && !all_posted; }
};

// Pulls a streamed room's next chunk into request.copies (its caller holds the room: q.mu, or
// Submit before the room is queued), each copy checked against the envelope Submit checked, so
// no copy outside it is ever posted. At the end the bytes must be the envelope's.
absl::Status PullChunk(Room& room) {
  CopyList& copies = room.request.copies;
  copies.clear();
  const size_t n = room.request.stream->Next(copies.Extend(kStreamChunk), kStreamChunk);
  copies.Truncate(n);
  room.next_copy = 0;
  room.next_offset = 0;
  const CopyEnvelope& e = room.envelope;
  if (n == 0) {
    room.stream_done = true;
    if (room.streamed_bytes == e.bytes) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat(
        "transfer %d: its copy source ended after %u bytes, where its envelope said %u",
        room.request.transfer_id, room.streamed_bytes, e.bytes));
  }
  const auto inside = [](uint64_t offset, uint64_t length, uint64_t begin, uint64_t end) {
    return offset >= begin && offset <= end && length <= end - offset;
  };
  for (size_t i = 0; i < n; ++i) {
    const Copy& c = copies[i];
    if (c.length == 0 || !inside(c.src_offset, c.length, e.src_begin, e.src_end) ||
        !inside(c.dst_offset, c.length, e.dst_begin, e.dst_end) ||
        c.length > e.bytes - room.streamed_bytes) {
      copies.clear();
      return absl::InternalError(absl::StrFormat(
          "transfer %d: copy %d of its source (%u bytes from source offset %u to destination "
          "offset %u) lies outside the envelope the source gave (source [%u, %u), destination "
          "[%u, %u), %u bytes); it was not posted",
          room.request.transfer_id, room.stats.copies + i, c.length, c.src_offset, c.dst_offset,
          e.src_begin, e.src_end, e.dst_begin, e.dst_end, e.bytes));
    }
    room.streamed_bytes += c.length;
  }
  room.stats.copies += n;
  return absl::OkStatus();
}

// A PostWrites or Flush decided and counted under the queue's lock, made outside it.
struct Call {
  bool flush = false;
  std::shared_ptr<Room> room;
  std::vector<Write> writes;  // !flush
  uint64_t bytes = 0;         // !flush
};

// The rooms and endpoints of one peer. Its lock is never held across rooms of other peers,
// nor while a call is made to the transport: a lane's calls are made by the thread of that
// lane's completions, so lanes post (over shared memory: copy) on several cores at once.
struct PeerQueue {
  std::mutex mu;
  // The scheduler disconnected this peer (a fence that did not drain within fence_timeout):
  // nothing more is posted to it, and fences need no flush.
  bool disconnected = false;
  std::vector<uint64_t> lane_inflight;
  std::vector<LaneCalls<Call>> calls;          // per lane (lane_calls.h)
  std::deque<std::shared_ptr<Room>> runnable;  // FIFO: rooms with slices still to post
  // Batches' write vectors whose calls were made, kept with their capacity for the next
  // batches (no allocation per batch once warm); at most kSpareBatches.
  static constexpr size_t kSpareBatches = 64;
  std::vector<std::vector<Write>> spare_batches;
};

// The rooms in flight whose transfer ids fall in one stripe, and their deadlines. Submit, Cancel
// and a room's end take only the room's stripe: rooms of different stripes (and peers) never
// meet on a lock.
struct RoomStripe {
  std::mutex mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Room>> rooms;
  std::multimap<absl::Time, std::weak_ptr<Room>> deadlines;
};
constexpr size_t kStripes = 16;

// An outcome to deliver, with what goes back to the caller with it.
struct Delivery {
  RoomOutcome outcome;
  RoomDone done;
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
  bool disconnect_fences = true;  // Capabilities::disconnect_fences

  // Lock order: peers_mu, a PeerQueue's mu, a RoomStripe's mu, mu. A landed room takes its
  // peer's queue and its stripe only; mu is the delivery thread's (failures, deadlines).
  std::array<RoomStripe, kStripes> stripes;
  // Written (a queue added or forgotten) rarely; read by every Submit, never waiting on another.
  mutable std::shared_mutex peers_mu;
  std::map<PeerId, std::unique_ptr<PeerQueue>> peers;
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<Delivery> ready;  // outcomes for the delivery thread (guarded by mu)
  bool dirty = false;          // guarded by mu: a deadline or an outcome came; look again
  // The earliest deadline the delivery thread sleeps until (Unix ns; INT64_MAX while it looks
  // or has none): a room with an earlier one wakes it.
  std::atomic<int64_t> next_wake_ns{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> shutdown{false};
  std::atomic<uint64_t> rooms_in_flight{0};
  // Outcomes handed to a completing thread (landed rooms) whose `done` has not returned yet.
  std::atomic<uint64_t> delivering{0};
  // Counted on the posting and completion paths without a lock shared by every room.
  std::atomic<uint64_t> writes_posted{0};
  std::atomic<uint64_t> batches_posted{0};
  std::atomic<uint64_t> rooms_ok{0};
  std::atomic<uint64_t> rooms_failed{0};
  std::atomic<uint64_t> rooms_rejected{0};
  std::atomic<uint64_t> bytes_landed{0};
  std::thread delivery;

  // Set by a completion (OnBatchDone, OnFlushDone) while it holds its peer's lock: a room that
  // lands there is delivered by that thread once it lets the lock go, not by a hop to the
  // delivery thread. Failures always take the delivery thread.
  static thread_local Deliveries* landed_here;
  struct LandedHere {
    explicit LandedHere(Deliveries* out) { landed_here = out; }
    ~LandedHere() { landed_here = nullptr; }
  };

  RoomStripe& StripeOf(uint64_t transfer_id) {
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

  // The rooms in flight to `peer` (takes each stripe's mu in turn).
  std::vector<std::shared_ptr<Room>> RoomsOf(PeerId peer) {
    std::vector<std::shared_ptr<Room>> hit;
    for (RoomStripe& stripe : stripes) {
      std::lock_guard<std::mutex> lock(stripe.mu);
      for (auto& [id, room] : stripe.rooms) {
        if (room->request.peer == peer) hit.push_back(room);
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

  // Ends `room` with its status (needs q.mu). A landed room's outcome is delivered by the
  // completion that landed it (landed_here), any other by the delivery thread.
  void FinishLocked(Room& room) {
    if (room.finished) return;
    room.finished = true;
    room.stats.duration = absl::Now() - room.started;
    RoomOutcome outcome;
    outcome.transfer_id = room.request.transfer_id;
    outcome.status = room.status;
    outcome.stats = room.stats;
    outcome.peer_disconnected = room.peer_disconnected;
    outcome.fence_proven =
        room.status.ok() || disconnect_fences || (!room.peer_disconnected && !room.flush_failed);
    if (room.status.ok()) {
      rooms_ok.fetch_add(1, std::memory_order_relaxed);
      bytes_landed.fetch_add(room.stats.bytes, std::memory_order_relaxed);
    } else {
      rooms_failed.fetch_add(1, std::memory_order_relaxed);
    }
    // The copies go now, not at the room's last completion: back to the caller, or freed,
    // outside every lock (a large list's free unmaps it).
    Delivery delivery{std::move(outcome), std::move(room.request.done),
                      std::move(room.request.copies), std::move(room.request.recycle),
                      std::move(room.request.stream)};
    room.request.copies = CopyList();
    {  // out of the table before `done` can run: the caller may reuse the id from there
      RoomStripe& stripe = StripeOf(room.request.transfer_id);
      std::lock_guard<std::mutex> lock(stripe.mu);
      stripe.rooms.erase(room.request.transfer_id);
      if (room.has_deadline) {
        stripe.deadlines.erase(room.deadline);
        room.has_deadline = false;
      }
    }
    // The room leaves the count before `done` can run, and never before its outcome is counted
    // where the delivery thread's exit looks (delivering, or ready under mu).
    if (room.status.ok() && landed_here != nullptr) {
      delivering.fetch_add(1);
      rooms_in_flight.fetch_sub(1);
      landed_here->push_back(std::move(delivery));
    } else {
      std::lock_guard<std::mutex> lock(mu);
      rooms_in_flight.fetch_sub(1);
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

  // Sets (or moves) `room`'s deadline entry to `when` (takes its stripe's mu).
  void SetDeadline(Room& room, absl::Time when) {
    {
      RoomStripe& stripe = StripeOf(room.request.transfer_id);
      std::lock_guard<std::mutex> lock(stripe.mu);
      if (room.has_deadline) stripe.deadlines.erase(room.deadline);
      room.deadline = stripe.deadlines.emplace(when, room.weak_from_this());
      room.has_deadline = true;
    }
    WakeFor(when);
  }

  // Fails `room` with `status` unless it already failed or ended (needs q.mu): nothing more of
  // it is posted, its calls not yet made are dropped, and its outcome waits for the fence
  // (MaybeFencedLocked). The caller makes the calls this queues (SendLocked).
  void FailLocked(PeerQueue& q, Room& room, absl::Status status) {
    if (room.finished || room.fencing) return;
    room.status = std::move(status);
    room.fencing = true;
    q.runnable.erase(
        std::remove_if(q.runnable.begin(), q.runnable.end(),
                       [&](const std::shared_ptr<Room>& r) { return r.get() == &room; }),
        q.runnable.end());
    for (int lane = 0; lane < lanes; ++lane) {
      std::vector<Call>& queued = q.calls[lane].queued;
      size_t kept = 0;
      for (size_t i = 0; i < queued.size(); ++i) {
        if (queued[i].room.get() == &room) {
          UndoLocked(q, lane, queued[i]);
          continue;
        }
        if (kept != i) queued[kept] = std::move(queued[i]);
        ++kept;
      }
      queued.resize(kept);
    }
    SetDeadline(room, absl::Now() + fence_timeout);
    MaybeFencedLocked(q, room);
  }

  // Failed means fenced (needs q.mu): once every call made for a failing room has completed, a
  // flush of each lane it wrote on is queued, and once those complete (OK: its writes landed;
  // an error: the backend's lane failed and none of them lands later), or the peer was
  // disconnected, no write of the room can land any more and its outcome goes out.
  void MaybeFencedLocked(PeerQueue& q, Room& room) {
    if (room.finished || !room.fencing || room.outstanding > 0) return;
    if (!room.fence_flushed && !q.disconnected && room.posted_bytes > 0) {
      room.fence_flushed = true;
      std::shared_ptr<Room> held = room.shared_from_this();
      for (int lane = 0; lane < lanes; ++lane) {
        if (!room.lane_used[lane]) continue;
        ++room.outstanding;
        q.calls[lane].queued.push_back(Call{true, held, {}, 0});
      }
      if (room.outstanding > 0) return;
    }
    if (q.disconnected) room.peer_disconnected = true;
    FinishLocked(room);
  }

  void MaybeCompleteLocked(Room& room) {
    if (!room.finished && !room.fencing && room.all_posted && room.outstanding == 0) {
      FinishLocked(room);
    }
  }

  // The lane with the fewest bytes in flight that may take `bytes` more, or -1.
  int PickLane(const PeerQueue& q, uint64_t bytes) const {
    int best = -1;
    for (int lane = 0; lane < lanes; ++lane) {
      const uint64_t inflight = q.lane_inflight[lane];
      const bool fits = inflight == 0 || inflight + bytes <= inflight_cap;
      if (fits && (best < 0 || inflight < q.lane_inflight[best])) best = lane;
    }
    return best;
  }

  // Posts as much of `peer`'s queued work as the in-flight bound allows, or `max_batches`
  // batches of it (needs q.mu).
  void PumpLocked(PeerId peer, PeerQueue& q,
                  size_t max_batches = std::numeric_limits<size_t>::max()) {
    for (size_t batches = 0; batches < max_batches && !q.runnable.empty();) {
      std::shared_ptr<Room> room = q.runnable.front();
      if (!room->HasWork()) {
        q.runnable.pop_front();
        continue;
      }
      const CopyList& copies = room->request.copies;
      const uint64_t first_len =
          std::min(slice, copies[room->next_copy].length - room->next_offset);
      const int lane = PickLane(q, first_len);
      if (lane < 0) return;  // every lane is full: a completion pumps again
      const uint64_t budget = q.lane_inflight[lane] == 0 ? std::max(inflight_cap, first_len)
                                                         : inflight_cap - q.lane_inflight[lane];
      std::vector<Write> batch;
      if (!q.spare_batches.empty()) {
        batch = std::move(q.spare_batches.back());
        q.spare_batches.pop_back();
      } else {
        batch.reserve(std::min<size_t>(batch_cap, copies.size() - room->next_copy));
      }
      uint64_t bytes = 0;
      size_t copy = room->next_copy;
      uint64_t offset = room->next_offset;
      while (copy < copies.size() && batch.size() < batch_cap) {
        const Copy& c = copies[copy];
        const uint64_t length = std::min(slice, c.length - offset);
        if (!batch.empty() && bytes + length > budget) break;
        batch.push_back(
            {c.src_offset + offset, room->request.remote_base + c.dst_offset + offset, length});
        bytes += length;
        offset += length;
        if (offset == c.length) {
          ++copy;
          offset = 0;
        }
      }
      room->next_copy = copy;
      room->next_offset = offset;
      room->posted_bytes += bytes;
      ++room->outstanding;
      room->lane_used[lane] = true;
      room->stats.writes += batch.size();
      ++room->stats.batches;
      q.lane_inflight[lane] += bytes;
      writes_posted.fetch_add(batch.size(), std::memory_order_relaxed);
      batches_posted.fetch_add(1, std::memory_order_relaxed);
      q.calls[lane].queued.push_back(Call{false, room, std::move(batch), bytes});
      ++batches;
      if (copy == copies.size() && !MoreCopiesLocked(q, *room)) {
        // A stream that broke its envelope failed the room, which left `runnable` then.
        if (!room->status.ok()) continue;
        q.runnable.pop_front();
        room->all_posted = true;
        FlushLocked(q, room);
      }
    }
  }

  // A list's copies are all posted, or a stream's chunk is: pulls the stream's next chunk
  // (needs q.mu). False when there is none: a list, the stream's end, or a chunk that broke
  // the envelope (the room fails, with what it posted fenced).
  bool MoreCopiesLocked(PeerQueue& q, Room& room) {
    if (!room.request.stream || room.stream_done) return false;
    absl::Status pulled = PullChunk(room);
    if (!pulled.ok()) {
      FailLocked(q, room, std::move(pulled));
      return false;
    }
    return !room.stream_done;
  }

  // Success means landed: flush every lane the room wrote on (needs q.mu).
  void FlushLocked(PeerQueue& q, const std::shared_ptr<Room>& room) {
    for (int lane = 0; lane < lanes; ++lane) {
      if (!room->lane_used[lane]) continue;
      ++room->stats.lanes_used;
      ++room->outstanding;
      q.calls[lane].queued.push_back(Call{true, room, {}, 0});
    }
    MaybeCompleteLocked(*room);
  }

  // Takes back what queuing `call` counted, for a call that never reached the transport.
  void UndoLocked(PeerQueue& q, int lane, const Call& call) {
    Room& room = *call.room;
    --room.outstanding;
    if (call.flush) {
      if (!room.fencing) --room.stats.lanes_used;
      return;
    }
    q.lane_inflight[lane] -= call.bytes;
    room.posted_bytes -= call.bytes;
    room.stats.writes -= call.writes.size();
    --room.stats.batches;
    writes_posted.fetch_sub(call.writes.size(), std::memory_order_relaxed);
    batches_posted.fetch_sub(1, std::memory_order_relaxed);
  }

  absl::Status Issue(PeerId peer, PeerQueue& q, int lane, const Call& call) {
    std::weak_ptr<Core> weak = weak_from_this();
    std::shared_ptr<Room> held = call.room;
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

  // Makes the queued calls to `peer` (SendLaneCalls): calls of rooms that ended meanwhile are
  // dropped, and a refused call fails its room.
  void SendLocked(std::unique_lock<std::mutex>& lock, PeerId peer, PeerQueue& q, int self) {
    struct Hooks {
      Core& core;
      PeerId peer;
      PeerQueue& q;
      bool Keep(const Call& call) { return !call.room->finished; }
      void Undo(int lane, const Call& call) { core.UndoLocked(q, lane, call); }
      void Taking(const Call&) {}
      void Taken(Call& call) {
        if (call.flush || q.spare_batches.size() >= PeerQueue::kSpareBatches) return;
        call.writes.clear();
        q.spare_batches.push_back(std::move(call.writes));
      }
      absl::Status Issue(int lane, const Call& call) { return core.Issue(peer, q, lane, call); }
      void Failed(int /*lane*/, Call& call, absl::Status status) {
        Room& room = *call.room;
        if (call.flush) room.flush_failed = true;
        core.FailLocked(q, room,
                        absl::Status(status.code(),
                                     absl::StrCat("transfer ", room.request.transfer_id,
                                                  call.flush ? ": flush: " : ": posting writes: ",
                                                  status.message())));
        core.MaybeFencedLocked(q, room);  // a refused fence flush: nothing of it is in flight
      }
    } hooks{*this, peer, q};
    SendLaneCalls(lock, q.calls, self, hooks);
  }

  void OnBatchDone(PeerQueue& queue, PeerId peer, int lane, uint64_t bytes, Room& room,
                   const absl::Status& status) {
    Deliveries landed;
    {
      LandedHere here(&landed);
      std::unique_lock<std::mutex> lock(queue.mu);
      BatchDoneLocked(lock, queue, peer, lane, bytes, room, status);
    }
    DeliverLanded(landed);
  }

  void BatchDoneLocked(std::unique_lock<std::mutex>& lock, PeerQueue& queue, PeerId peer, int lane,
                       uint64_t bytes, Room& room, const absl::Status& status) {
    PeerQueue* q = &queue;
    --q->calls[lane].live;
    q->lane_inflight[lane] -= bytes;
    --room.outstanding;
    room.landed_bytes += bytes;
    if (!status.ok()) {
      FailLocked(*q, room,
                 absl::Status(status.code(),
                              absl::StrFormat("transfer %d: writes on lane %d failed after %d of "
                                              "%d bytes: %s",
                                              room.request.transfer_id, lane, room.landed_bytes,
                                              room.stats.bytes, status.message())));
    } else {
      MaybeCompleteLocked(room);
    }
    MaybeFencedLocked(*q, room);
    if (!shutdown.load()) PumpLocked(peer, *q);
    SendLocked(lock, peer, *q, lane);
  }

  void OnFlushDone(PeerQueue& queue, PeerId peer, int lane, Room& room,
                   const absl::Status& status) {
    Deliveries landed;
    {
      LandedHere here(&landed);
      std::unique_lock<std::mutex> lock(queue.mu);
      FlushDoneLocked(lock, queue, peer, lane, room, status);
    }
    DeliverLanded(landed);
  }

  void FlushDoneLocked(std::unique_lock<std::mutex>& lock, PeerQueue& queue, PeerId peer, int lane,
                       Room& room, const absl::Status& status) {
    PeerQueue* q = &queue;
    --q->calls[lane].live;
    --room.outstanding;
    if (!status.ok()) {
      room.flush_failed = true;
      FailLocked(*q, room,
                 absl::Status(status.code(),
                              absl::StrFormat("transfer %d: flush of lane %d failed: %s",
                                              room.request.transfer_id, lane, status.message())));
    } else {
      MaybeCompleteLocked(room);
    }
    MaybeFencedLocked(*q, room);
    SendLocked(lock, peer, *q, lane);
  }

  // A room's deadline passed: a room still moving fails (and starts fencing); a room whose
  // fence did not drain within fence_timeout has its peer disconnected.
  void Expire(const std::shared_ptr<Room>& room) {
    const PeerId peer = room->request.peer;
    PeerQueue* q = Queue(peer);
    std::unique_lock<std::mutex> lock(q->mu);
    if (room->finished) return;
    if (!room->fencing) {
      FailLocked(*q, *room,
                 absl::DeadlineExceededError(absl::StrFormat(
                     "transfer %d: deadline passed after %s with %d of %d bytes posted and "
                     "%d locally complete; the peer may be gone",
                     room->request.transfer_id, absl::FormatDuration(absl::Now() - room->started),
                     room->posted_bytes, room->stats.bytes, room->landed_bytes)));
      SendLocked(lock, peer, *q, -1);
      return;
    }
    room->status = absl::Status(
        room->status.code(),
        absl::StrFormat("%s; its writes did not drain within the fence timeout of %s, so peer %d "
                        "was disconnected (%s)",
                        room->status.message(), absl::FormatDuration(fence_timeout), peer,
                        disconnect_fences
                            ? "nothing it carried lands any more"
                            : "writes this transport had already handed over may still land"));
    DisconnectLocked(lock, peer, *q);
  }

  // Fences every room of `peer` at once by disconnecting it (needs q.mu, released for the call):
  // the transport fails whatever it still holds for the peer with kCancelled, and nothing of it
  // lands afterwards (Transport::Disconnect). Rooms still moving fail with `why`.
  void DisconnectLocked(std::unique_lock<std::mutex>& lock, PeerId peer, PeerQueue& q,
                        const absl::Status& why = absl::OkStatus()) {
    if (q.disconnected) return;
    q.disconnected = true;
    const std::vector<std::shared_ptr<Room>> hit = RoomsOf(peer);
    for (const auto& room : hit) {
      FailLocked(q, *room,
                 why.ok() ? absl::UnavailableError(absl::StrFormat(
                                "transfer %d: peer %d was disconnected: a room to it did not "
                                "drain within the fence timeout",
                                room->request.transfer_id, peer))
                          : absl::Status(why.code(), absl::StrFormat("transfer %d: %s",
                                                                     room->request.transfer_id,
                                                                     why.message())));
    }
    lock.unlock();
    const absl::Status disconnected = transport->Disconnect(peer);
    lock.lock();
    // NotFound: someone else disconnected it first; either way nothing of it lands any more.
    (void)disconnected;
    for (const auto& room : hit) MaybeFencedLocked(q, *room);
  }

  // Fails rooms whose deadline passed, then delivers outcomes; until shutdown and drained.
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
      std::vector<std::shared_ptr<Room>> expired;
      for (RoomStripe& stripe : stripes) {
        std::lock_guard<std::mutex> stripe_lock(stripe.mu);
        while (!stripe.deadlines.empty() && stripe.deadlines.begin()->first <= now) {
          if (auto room = stripe.deadlines.begin()->second.lock()) {
            room->has_deadline = false;
            expired.push_back(std::move(room));
          }
          stripe.deadlines.erase(stripe.deadlines.begin());
        }
        if (!stripe.deadlines.empty())
          earliest = std::min(earliest, stripe.deadlines.begin()->first);
      }
      if (earliest != absl::InfiniteFuture()) next_wake_ns.store(absl::ToUnixNanos(earliest));
      if (!expired.empty()) {
        for (const auto& room : expired) Expire(room);
        lock.lock();
        continue;
      }
      lock.lock();
      if (shutdown && rooms_in_flight.load() == 0 && ready.empty() && delivering.load() == 0) {
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
  core_->disconnect_fences = caps.disconnect_fences;
  core_->delivery = std::thread([core = core_.get()] { core->Run(); });
  NameThread(core_->delivery, "kvrail-sched");
}

Scheduler::~Scheduler() {
  std::set<PeerId> peers;
  core_->shutdown = true;  // before the stripes are read: a Submit after that is refused
  for (RoomStripe& stripe : core_->stripes) {
    std::lock_guard<std::mutex> lock(stripe.mu);
    for (auto& [id, room] : stripe.rooms) peers.insert(room->request.peer);
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

// OK when every offset of `e` lies inside the room's bounds: the source region, one of the
// peer's regions, and the destination's arena when it has a length; else InvalidArgument naming
// the side that does not. An envelope of no copies is inside.
absl::Status CheckEnvelope(const RoomTransfer& request, const CopyEnvelope& e,
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

// The payload bytes of a room whose copies all lie inside their bounds (the source region;
// one of the peer's regions; the destination's arena when it has a length), or InvalidArgument
// naming the first copy that does not. First the room's envelope, in one pass without a lookup
// per copy (a head-sliced room is half a million copies): when the lowest and highest offsets
// on each side lie inside, so does every copy. Only a room whose envelope does not is checked
// copy by copy, to name the copy.
absl::StatusOr<uint64_t> CheckedBytes(const RoomTransfer& request, const std::string& context) {
  CopyEnvelope e{UINT64_MAX, 0, UINT64_MAX, 0, 0, request.copies.size()};
  bool wraps = false;
  for (const Copy& c : request.copies) {
    const uint64_t src_end = c.src_offset + c.length;
    const uint64_t dst_end = c.dst_offset + c.length;
    wraps |= (c.length == 0) | (src_end < c.src_offset) | (dst_end < c.dst_offset);
    e.src_begin = std::min(e.src_begin, c.src_offset);
    e.src_end = std::max(e.src_end, src_end);
    e.dst_begin = std::min(e.dst_begin, c.dst_offset);
    e.dst_end = std::max(e.dst_end, dst_end);
    e.bytes += c.length;
  }
  if (!wraps && CheckEnvelope(request, e, context).ok()) return e.bytes;
  uint64_t total = 0;
  for (size_t i = 0; i < request.copies.size(); ++i) {
    const Copy& c = request.copies[i];
    if (c.length == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: copy %d of %d has length 0", context, i, request.copies.size()));
    }
    if (!transport::RangeInside(c.src_offset, c.length, 0, request.source_length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d: source [%u, +%u) lies outside the source region's %u bytes; "
          "nothing was written",
          context, i, request.copies.size(), c.src_offset, c.length, request.source_length));
    }
    const uint64_t address = request.remote_base + c.dst_offset;
    if (address < request.remote_base || !request.remote->Find(address, c.length).has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d: destination base 0x%x + offset %u, %u bytes, lies inside none of "
          "the peer's %d registered regions; nothing was written",
          context, i, request.copies.size(), request.remote_base, c.dst_offset, c.length,
          request.remote->size()));
    }
    if (request.remote_length > 0 &&
        !transport::RangeInside(c.dst_offset, c.length, 0, request.remote_length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: copy %d of %d: destination offset %u, %u bytes, lies outside the destination's "
          "arena of %u bytes at 0x%x; nothing was written",
          context, i, request.copies.size(), c.dst_offset, c.length, request.remote_length,
          request.remote_base));
    }
    total += c.length;
  }
  return total;
}

// The payload bytes of a streamed room whose envelope lies inside the bounds CheckedBytes
// checks each copy against, or InvalidArgument naming the side that does not.
absl::StatusOr<uint64_t> CheckedEnvelope(const RoomTransfer& request, const std::string& context) {
  if (!request.copies.empty()) {
    return absl::InvalidArgumentError(context +
                                      ": both a copy list and a copy source were given; give one");
  }
  const CopyEnvelope e = request.stream->envelope();
  if (absl::Status inside = CheckEnvelope(request, e, context); !inside.ok()) return inside;
  return e.bytes;
}

}  // namespace

absl::Status Scheduler::Submit(RoomTransfer request) {
  const std::string context = absl::StrCat("transfer ", request.transfer_id);
  if (!request.done) return absl::InvalidArgumentError(context + ": the completion is empty");
  if (request.remote == nullptr) {
    return absl::InvalidArgumentError(context + ": the peer's regions are missing");
  }
  auto reject = [&](absl::Status status) {
    core_->rooms_rejected.fetch_add(1, std::memory_order_relaxed);
    return status;
  };
  // Bounds before bytes: the whole room, before anything is posted.
  const bool streamed = request.stream != nullptr;
  absl::StatusOr<uint64_t> total =
      streamed ? CheckedEnvelope(request, context) : CheckedBytes(request, context);
  if (!total.ok()) return reject(total.status());
  auto room = std::make_shared<Room>();
  room->started = absl::Now();
  room->lane_used.assign(core_->lanes, false);
  room->stats.bytes = *total;
  room->stats.copies = request.copies.size();
  if (streamed) room->envelope = request.stream->envelope();
  room->request = std::move(request);
  if (streamed) {  // the first chunk, so that the room has copies when it is queued
    if (absl::Status pulled = PullChunk(*room); !pulled.ok()) {
      return reject(
          absl::InvalidArgumentError(absl::StrCat(pulled.message(), "; nothing was written")));
    }
  }
  const uint64_t id = room->request.transfer_id;
  const PeerId peer = room->request.peer;
  PeerQueue* q = nullptr;
  {
    // The room enters its stripe while the peer's queue is held (shared): ForgetPeer, which
    // takes peers_mu exclusively, then sees the room and keeps the queue.
    std::shared_lock<std::shared_mutex> shared(core_->peers_mu);
    std::unique_lock<std::shared_mutex> exclusive;
    if (auto found = core_->peers.find(peer); found != core_->peers.end()) {
      q = found->second.get();
    } else {
      shared.unlock();
      exclusive = std::unique_lock<std::shared_mutex>(core_->peers_mu);
      q = &core_->QueueLocked(peer);
    }
    RoomStripe& stripe = core_->StripeOf(id);
    std::lock_guard<std::mutex> lock(stripe.mu);
    // Read under the stripe's mu, which the destructor takes after setting it: a room that
    // gets in is one the destructor finds.
    if (core_->shutdown) {
      return absl::FailedPreconditionError(context + ": the scheduler is shut down");
    }
    if (!stripe.rooms.emplace(id, room).second) {
      core_->rooms_rejected.fetch_add(1, std::memory_order_relaxed);
      return absl::AlreadyExistsError(context + ": a transfer with this id is in flight");
    }
    core_->rooms_in_flight.fetch_add(1);
    if (room->request.deadline != absl::InfiniteFuture()) {
      room->deadline = stripe.deadlines.emplace(room->request.deadline, room);
      room->has_deadline = true;
    }
  }
  if (room->request.deadline != absl::InfiniteFuture()) core_->WakeFor(room->request.deadline);
  std::unique_lock<std::mutex> lock(q->mu);
  if (q->disconnected) {
    core_->FailLocked(*q, *room,
                      absl::UnavailableError(absl::StrFormat(
                          "%s: peer %d was disconnected after a fence timeout; connect it again",
                          context, room->request.peer)));
    return absl::OkStatus();  // the outcome says why, like any failure after Submit
  }
  if (room->request.copies.empty()) {
    room->all_posted = true;
    core_->FinishLocked(*room);
    return absl::OkStatus();
  }
  q->runnable.push_back(room);
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
  std::shared_ptr<Room> room;
  {
    RoomStripe& stripe = core_->StripeOf(transfer_id);
    std::lock_guard<std::mutex> lock(stripe.mu);
    auto it = stripe.rooms.find(transfer_id);
    if (it == stripe.rooms.end()) {
      return absl::NotFoundError(
          absl::StrFormat("transfer %d is not in flight (unknown or already done)", transfer_id));
    }
    room = it->second;
  }
  const PeerId peer = room->request.peer;
  PeerQueue* q = core_->Queue(peer);
  std::unique_lock<std::mutex> lock(q->mu);
  if (room->finished || room->fencing) {
    return absl::NotFoundError(absl::StrFormat("transfer %d already completed", transfer_id));
  }
  core_->FailLocked(*q, *room,
                    absl::CancelledError(absl::StrFormat("transfer %d: %s", transfer_id, why)));
  core_->SendLocked(lock, peer, *q, -1);
  return absl::OkStatus();
}

void Scheduler::FailPeer(transport::PeerId peer, const absl::Status& status) {
  const std::vector<std::shared_ptr<Room>> hit = core_->RoomsOf(peer);
  PeerQueue* q = core_->Queue(peer);
  std::unique_lock<std::mutex> lock(q->mu);
  for (const auto& room : hit) {
    core_->FailLocked(
        *q, *room,
        absl::Status(status.code(), absl::StrFormat("transfer %d: %s", room->request.transfer_id,
                                                    status.message())));
  }
  core_->SendLocked(lock, peer, *q, -1);
}

bool Scheduler::ForgetPeer(transport::PeerId peer) {
  // Exclusively: no Submit is between finding the queue and entering its room in a stripe.
  std::unique_lock<std::shared_mutex> lock(core_->peers_mu);
  auto found = core_->peers.find(peer);
  if (found == core_->peers.end()) return true;
  if (!core_->RoomsOf(peer).empty()) return false;
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

uint64_t Scheduler::rooms_in_flight() const { return core_->rooms_in_flight.load(); }

SchedulerStats Scheduler::stats() const {
  SchedulerStats stats;
  stats.rooms_ok = core_->rooms_ok.load(std::memory_order_relaxed);
  stats.rooms_failed = core_->rooms_failed.load(std::memory_order_relaxed);
  stats.rooms_rejected = core_->rooms_rejected.load(std::memory_order_relaxed);
  stats.bytes_landed = core_->bytes_landed.load(std::memory_order_relaxed);
  stats.writes = core_->writes_posted.load(std::memory_order_relaxed);
  stats.batches = core_->batches_posted.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace kvrail::transfer
