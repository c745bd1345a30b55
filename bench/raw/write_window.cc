#include "bench/raw/write_window.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/transfer/lane_calls.h"
#include "engine/transport/transport.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The monotonic clock at its coarse resolution (a few ms): cheap enough to read on every pump,
// fine for a window's deadline. Start and end are read from Clock.
Clock::time_point CoarseNow() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return Clock::time_point(std::chrono::seconds(now.tv_sec) +
                           std::chrono::nanoseconds(now.tv_nsec));
}
using transport::PeerId;
using transport::RegionId;
using transport::Transport;
using transport::Write;

// One PostWrites call: one lane's share of one batch, or part of it. A few writes are kept
// inline: a batch of one block is one to four slices, and a malloc per post showed in perf over
// shm.
struct Post {
  absl::InlinedVector<Write, 4> writes;
  uint64_t bytes = 0;
};

struct LaneState;

// What a call's completion needs, kept by its lane from the call's decision to its completion,
// so that the completion captures two pointers and std::function holds it without allocating.
struct Pending {
  LaneState* lane = nullptr;
  uint64_t bytes = 0;   // a post's bytes; a flush's: the bytes it covers
  uint64_t writes = 0;  // a post's Write entries
};

// A PostWrites or a Flush decided under the lane's lock and made outside it.
struct Action {
  bool flush = false;
  Post post;                   // !flush
  Pending* pending = nullptr;  // from NewPendingLocked; back to the lane when it completes
};

// One lane's part of the window. Lanes share nothing while they post: each generates its own
// slices of every batch, posts, flushes and counts under its own lock, from the thread of its
// own completions. (With one lock for the window, two lanes' threads met in futex waits on
// every post: 64 KiB writes in 32 KiB slices over shm measured 0.67 to 0.94 of one lane.)
struct LaneState {
  explicit LaneState(int i) : index(i), calls(1) {}

  const int index;
  std::mutex mu;
  // Guarded by mu:
  std::deque<Post> queue;   // generated, not yet posted
  int posts = 0;            // PostWrites calls outstanding (queued in calls or made)
  uint64_t unflushed = 0;   // bytes posted since the lane's last Flush
  uint64_t flushing = 0;    // bytes covered by this lane's Flush calls outstanding
  int flushes = 0;          // Flush calls outstanding
  uint64_t next_batch = 0;  // the next batch whose share this lane generates
  bool stopped = false;     // generates no more
  bool final_flush_started = false;
  bool finished = false;
  uint64_t done_bytes = 0;
  uint64_t done_writes = 0;
  uint64_t done_posts = 0;
  uint64_t flushes_posted = 0;
  Clock::time_point end;
  std::vector<transfer::LaneCalls<Action>> calls;  // this lane's one queue (lane_calls.h)
  std::vector<std::unique_ptr<Pending>> pending;   // every Pending made
  std::vector<Pending*> spare;                     // those no call holds

  uint64_t inflight() const { return unflushed + flushing; }  // posted, not known landed
};

// Batches a window generates: enough for spec.max_bytes, or unbounded (until the deadline).
uint64_t MaxBatches(const WindowSpec& spec) {
  if (spec.max_bytes == 0) return UINT64_MAX;
  const uint64_t batch_bytes = spec.block_bytes * static_cast<uint64_t>(spec.batch);
  return (spec.max_bytes + batch_bytes - 1) / batch_bytes;
}

// Completions point at the window: RunWriteWindow keeps it until every completion has returned
// (callbacks_), and for good when the transport never finished (patience ran out).
class Window {
 public:
  Window(Transport& transport, PeerId peer, RegionId source, const WindowSpec& spec)
      : transport_(transport),
        peer_(peer),
        source_(source),
        spec_(spec),
        slots_(std::max<uint64_t>(1, spec.working_set / spec.block_bytes)),
        slices_per_block_((spec.block_bytes + spec.slice_bytes - 1) / spec.slice_bytes),
        flush_bytes_(spec.flush_bytes > 0
                         ? spec.flush_bytes
                         : std::max<uint64_t>(1, spec.inflight_bytes_per_lane / 2)),
        max_batches_(MaxBatches(spec)),
        // Slice i of the working set goes to lane i % lanes: lanes past the working set's
        // slice count never get a write.
        active_(static_cast<int>(std::min<uint64_t>(spec.lanes, slots_ * slices_per_block_))) {
    for (int i = 0; i < active_; ++i) lanes_.push_back(std::make_unique<LaneState>(i));
  }

  // Run gave up waiting for the transport (read by Run's caller, on Run's thread).
  bool abandoned() const { return abandoned_; }
  // The window's completions have all returned: none runs, none is due.
  bool Quiet() const { return callbacks_.load(std::memory_order_acquire) == 0; }

  absl::StatusOr<WindowResult> Run() {
    start_ = Clock::now();
    deadline_ = start_ + absl::ToChronoNanoseconds(spec_.duration);
    for (auto& lane : lanes_) {
      std::unique_lock<std::mutex> lock(lane->mu);
      PumpLocked(*lane);
      SendLocked(*lane, lock, -1);
    }
    std::unique_lock<std::mutex> lock(mu_);
    const bool finished = done_.wait_for(lock, absl::ToChronoNanoseconds(spec_.patience),
                                         [this] { return finished_lanes_ == active_; });
    if (!finished) {
      abandoned_ = true;
      FailLocked(absl::DeadlineExceededError("window: stopped waiting"));
      lock.unlock();
      int posts = 0;
      int flushes = 0;
      for (auto& lane : lanes_) {
        std::lock_guard<std::mutex> lane_lock(lane->mu);
        posts += lane->posts;
        flushes += lane->flushes;
      }
      return absl::DeadlineExceededError(absl::StrFormat(
          "window of %u-byte writes, batch %d: the transport did not complete %d posts and %d "
          "flushes within %s",
          spec_.block_bytes, spec_.batch, posts, flushes, absl::FormatDuration(spec_.patience)));
    }
    if (!error_.ok()) return error_;
    lock.unlock();
    WindowResult result;
    Clock::time_point end = start_;
    for (auto& lane : lanes_) {
      std::lock_guard<std::mutex> lane_lock(lane->mu);
      result.bytes += lane->done_bytes;
      result.writes += lane->done_writes;
      result.posts += lane->done_posts;
      result.flushes += lane->flushes_posted;
      end = std::max(end, lane->end);
    }
    result.elapsed = absl::FromChrono(end - start_);
    return result;
  }

 private:
  bool HasRoom(const LaneState& lane, uint64_t bytes) const {
    if (lane.posts >= spec_.posts_per_lane) return false;
    return lane.inflight() == 0 || lane.inflight() + bytes <= spec_.inflight_bytes_per_lane;
  }

  // The window's first failure; every lane stops at its next step.
  void Fail(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(std::move(status));
  }
  void FailLocked(absl::Status status) {
    if (error_.ok()) error_ = std::move(status);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool Failed() const { return failed_.load(std::memory_order_relaxed); }

  void StopLocked(LaneState& lane) {
    lane.stopped = true;
    lane.queue.clear();
  }

  // Generates the lane's share of the next batch that has one: its slices (slice i of the
  // working set, counting every slot's slices in address order, is lane i % lanes's) cut into
  // posts. False once the window's batches are all generated.
  bool GenerateLocked(LaneState& lane) {
    const uint64_t lanes = static_cast<uint64_t>(spec_.lanes);
    while (lane.next_batch < max_batches_) {
      const uint64_t batch = lane.next_batch++;
      Post post;
      for (int i = 0; i < spec_.batch; ++i) {
        const uint64_t slot = (batch * static_cast<uint64_t>(spec_.batch) + i) % slots_;
        const uint64_t first = slot * slices_per_block_;
        // The first of this block's slices that is this lane's, then every lanes-th.
        for (uint64_t j = (lane.index + lanes - first % lanes) % lanes; j < slices_per_block_;
             j += lanes) {
          const uint64_t off = j * spec_.slice_bytes;
          const uint64_t length = std::min(spec_.slice_bytes, spec_.block_bytes - off);
          if (!post.writes.empty() && post.bytes + length > spec_.post_bytes) {
            lane.queue.push_back(std::move(post));
            post = Post();
          }
          post.writes.push_back(Write{spec_.source_offset + slot * spec_.block_bytes + off,
                                      spec_.destination_address + slot * spec_.block_bytes + off,
                                      length});
          post.bytes += length;
        }
      }
      if (!post.writes.empty()) lane.queue.push_back(std::move(post));
      if (!lane.queue.empty()) return true;
    }
    return false;
  }

  Pending* NewPendingLocked(LaneState& lane, uint64_t bytes, uint64_t writes) {
    if (lane.spare.empty()) {
      lane.pending.push_back(std::make_unique<Pending>());
      lane.spare.push_back(lane.pending.back().get());
    }
    Pending* pending = lane.spare.back();
    lane.spare.pop_back();
    *pending = Pending{&lane, bytes, writes};
    return pending;
  }

  void PostLocked(LaneState& lane) {
    Post post = std::move(lane.queue.front());
    lane.queue.pop_front();
    const uint64_t bytes = post.bytes;
    Pending* pending = NewPendingLocked(lane, bytes, post.writes.size());
    lane.calls[0].queued.push_back(Action{false, std::move(post), pending});
    ++lane.posts;
    lane.unflushed += bytes;
    if (lane.unflushed >= flush_bytes_) FlushLaneLocked(lane);
  }

  // Flushes what the lane posted since its last flush; those bytes stay in flight until it
  // completes.
  void FlushLaneLocked(LaneState& lane) {
    const uint64_t covered = std::exchange(lane.unflushed, 0);
    lane.flushing += covered;
    ++lane.flushes;
    ++lane.flushes_posted;
    lane.calls[0].queued.push_back(Action{true, Post(), NewPendingLocked(lane, covered, 0)});
  }

  // Takes back the counts of an action that never reached the transport.
  void UndoLocked(LaneState& lane, const Action& action) {
    lane.spare.push_back(action.pending);
    if (action.flush) {
      lane.flushing -= action.pending->bytes;
      --lane.flushes;
      --lane.flushes_posted;
    } else {
      --lane.posts;
    }
  }

  // Makes the lane's queued calls (engine/transfer/lane_calls.h) outside its lock: `self` is 0
  // from the lane's own completion (its thread sends), -1 from Run (sends only when nothing of
  // the lane's is at the transport). After a failure nothing more is sent.
  void SendLocked(LaneState& lane, std::unique_lock<std::mutex>& lock, int self) {
    struct Hooks {
      Window& window;
      LaneState& lane;
      bool Keep(const Action&) { return !window.Failed(); }
      void Undo(int, const Action& action) { window.UndoLocked(lane, action); }
      void Taking(const Action&) {}
      void Taken(const Action&) {}
      absl::Status Issue(int, const Action& action) { return window.Issue(lane.index, action); }
      void Failed(int, Action&, absl::Status status) { window.Fail(std::move(status)); }
    } hooks{*this, lane};
    transfer::SendLaneCalls(lock, lane.calls, self, hooks);
    if (Failed()) {
      StopLocked(lane);
      if (lane.posts == 0 && lane.flushes == 0) FinishLocked(lane);
    }
  }

  // Two pointers: std::function keeps them inline (no allocation per call).
  absl::Status Issue(int index, const Action& action) {
    Pending* pending = action.pending;
    if (action.flush) {
      return transport_.Flush(peer_, index, [this, pending](absl::Status s) {
        Entered();
        OnFlushDone(pending, std::move(s));
        Left();
      });
    }
    return transport_.PostWrites(peer_, index, source_, action.post.writes,
                                 [this, pending](absl::Status s) {
                                   Entered();
                                   OnPostDone(pending, std::move(s));
                                   Left();
                                 });
  }

  // Around every completion: the window may go once none is inside one and none is due. The
  // count rises before the completion takes a lock (where it may finish the window) and falls
  // after it has released it, as the completion's last touch of the window.
  void Entered() { callbacks_.fetch_add(1, std::memory_order_relaxed); }
  void Left() { callbacks_.fetch_sub(1, std::memory_order_release); }

  void PumpLocked(LaneState& lane) {
    if (!lane.stopped && (Failed() || CoarseNow() >= deadline_)) {
      // A batch larger than the window is measured in part: what is not posted is dropped.
      StopLocked(lane);
    }
    while (true) {
      while (!lane.queue.empty() && HasRoom(lane, lane.queue.front().bytes)) PostLocked(lane);
      // Full of bytes nobody has asked about: ask, so that room comes back.
      if (!lane.queue.empty() && lane.flushes == 0 && lane.unflushed > 0 &&
          lane.posts < spec_.posts_per_lane) {
        FlushLaneLocked(lane);
      }
      if (!lane.queue.empty() || lane.stopped || !HasRoom(lane, 0)) break;
      if (!GenerateLocked(lane)) lane.stopped = true;
    }
    if (!lane.stopped || !lane.queue.empty() || lane.posts > 0) return;
    if (Failed()) {
      if (lane.flushes == 0) FinishLocked(lane);
      return;
    }
    if (!lane.final_flush_started) {
      // The lane's end: a Flush, so that every byte it counted has landed.
      lane.final_flush_started = true;
      FlushLaneLocked(lane);
    }
  }

  void OnPostDone(Pending* pending, absl::Status status) {
    LaneState& lane = *pending->lane;
    std::unique_lock<std::mutex> lock(lane.mu);
    const uint64_t bytes = pending->bytes;
    const uint64_t writes = pending->writes;
    lane.spare.push_back(pending);
    --lane.calls[0].live;
    --lane.posts;
    if (status.ok()) {
      lane.done_bytes += bytes;
      lane.done_writes += writes;
      ++lane.done_posts;
    } else {
      Fail(std::move(status));
    }
    PumpLocked(lane);
    SendLocked(lane, lock, 0);
  }

  void OnFlushDone(Pending* pending, absl::Status status) {
    LaneState& lane = *pending->lane;
    std::unique_lock<std::mutex> lock(lane.mu);
    const uint64_t covered = pending->bytes;
    lane.spare.push_back(pending);
    --lane.calls[0].live;
    lane.flushing -= covered;
    --lane.flushes;
    if (!status.ok()) Fail(std::move(status));
    if (lane.final_flush_started || Failed()) {
      StopLocked(lane);
      if (lane.flushes == 0 && lane.posts == 0) FinishLocked(lane);
    } else {
      PumpLocked(lane);
    }
    SendLocked(lane, lock, 0);
  }

  // The lane's lock held: it is done; the window is once every lane is.
  void FinishLocked(LaneState& lane) {
    if (lane.finished) return;
    lane.finished = true;
    lane.end = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (++finished_lanes_ == active_) done_.notify_all();
  }

  Transport& transport_;
  const PeerId peer_;
  const RegionId source_;
  const WindowSpec spec_;
  const uint64_t slots_;
  const uint64_t slices_per_block_;
  const uint64_t flush_bytes_;
  const uint64_t max_batches_;  // batches to generate (max_bytes); UINT64_MAX: until the deadline
  const int active_;            // lanes that get writes
  // Fixed before Run; each guards itself.
  std::vector<std::unique_ptr<LaneState>> lanes_;
  Clock::time_point start_;     // written by Run before any lane runs
  Clock::time_point deadline_;  // likewise
  std::atomic<bool> failed_{false};
  std::atomic<int> callbacks_{0};  // completions running now

  std::mutex mu_;  // after a lane's, never before
  std::condition_variable done_;
  // Guarded by mu_:
  int finished_lanes_ = 0;
  absl::Status error_;

  bool abandoned_ = false;  // Run's thread only
};

}  // namespace

double WindowResult::gbps() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

double WindowResult::blocks_per_s(uint64_t block_bytes) const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 && block_bytes > 0
             ? static_cast<double>(bytes) / static_cast<double>(block_bytes) / seconds
             : 0;
}

absl::StatusOr<WindowResult> RunWriteWindow(transport::Transport& transport, transport::PeerId peer,
                                            transport::RegionId source, const WindowSpec& spec) {
  const transport::Capabilities& caps = transport.capabilities();
  if (spec.block_bytes == 0 || spec.batch < 1 || spec.slice_bytes == 0 || spec.post_bytes == 0 ||
      spec.inflight_bytes_per_lane == 0 || spec.posts_per_lane < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "window: block %u B, batch %d, slice %u B, post %u B, in flight %u B and %d posts per "
        "lane: each must be at least 1",
        spec.block_bytes, spec.batch, spec.slice_bytes, spec.post_bytes,
        spec.inflight_bytes_per_lane, spec.posts_per_lane));
  }
  if (spec.working_set < spec.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window: working set %u B is smaller than one block (%u B)",
                        spec.working_set, spec.block_bytes));
  }
  if (spec.lanes < 1 || spec.lanes > caps.lanes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window: %d lanes; the transport has %d", spec.lanes, caps.lanes));
  }
  if (spec.slice_bytes > caps.max_write_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("window: slices of %u B exceed the transport's largest write (%u B)",
                        spec.slice_bytes, caps.max_write_bytes));
  }
  auto window = std::make_unique<Window>(transport, peer, source, spec);
  absl::StatusOr<WindowResult> result = window->Run();
  if (window->abandoned()) {
    // The transport still holds completions that point at the window: keep it for them, for
    // the rest of the process (a bench run that gives up on its transport ends soon after).
    static std::mutex* kept_mu = new std::mutex;
    static auto* kept = new std::vector<std::unique_ptr<Window>>;
    std::lock_guard<std::mutex> lock(*kept_mu);
    kept->push_back(std::move(window));
    return result;
  }
  // Finished: nothing is due, so once the completion that finished it has returned no other
  // will touch the window.
  while (!window->Quiet()) std::this_thread::yield();
  return result;
}

}  // namespace kvrail::bench
