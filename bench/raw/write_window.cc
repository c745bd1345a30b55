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

// One PostWrites call: part of one lane's share of one batch. A few writes are kept inline: a
// batch of one block is one to four slices, and a malloc per post showed in perf over shm.
struct Post {
  absl::InlinedVector<Write, 4> writes;
  uint64_t bytes = 0;
};

// What a call's completion needs, kept by the window (`pending_`) from the call's decision to
// its completion, so that the completion captures two pointers and std::function holds it
// without allocating.
struct Pending {
  int lane = 0;
  uint64_t bytes = 0;   // a post's bytes; a flush's: the bytes it covers
  uint64_t writes = 0;  // a post's Write entries
};

// A PostWrites or a Flush decided under the window's lock and made outside it.
struct Action {
  bool flush = false;
  Post post;                   // !flush
  Pending* pending = nullptr;  // from NewPendingLocked; back to the window when it completes
};

struct Lane {
  std::deque<Post> queue;  // posts of generated batches, not yet posted
  int posts = 0;           // PostWrites calls outstanding (queued in calls_ or made)
  uint64_t unflushed = 0;  // bytes posted since the lane's last Flush
  uint64_t flushing = 0;   // bytes covered by this lane's Flush calls outstanding
  int flushes = 0;         // Flush calls outstanding
  uint64_t inflight() const { return unflushed + flushing; }  // posted, not known landed
};

// Completions point at the window: RunWriteWindow keeps it until every completion has returned
// (callbacks_), and leaks it when the transport never finished (patience ran out).
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
        lanes_(spec.lanes),
        calls_(spec.lanes),
        open_(spec.lanes) {}

  // The window's completions have all returned: none runs, none is due. Read without mu_.
  bool Abandoned() {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_;
  }
  bool Quiet() const { return callbacks_.load(std::memory_order_acquire) == 0; }

  absl::StatusOr<WindowResult> Run() {
    std::unique_lock<std::mutex> lock(mu_);
    start_ = Clock::now();
    deadline_ = start_ + absl::ToChronoNanoseconds(spec_.duration);
    PumpLocked();
    SendLocked(lock, -1);
    const bool finished = done_.wait_for(lock, absl::ToChronoNanoseconds(spec_.patience),
                                         [this] { return finished_; });
    if (!finished) {
      StopLocked(absl::DeadlineExceededError("window: stopped waiting"));
      abandoned_ = true;
      return absl::DeadlineExceededError(absl::StrFormat(
          "window of %u-byte writes, batch %d: the transport did not complete %d posts and %d "
          "flushes within %s",
          spec_.block_bytes, spec_.batch, posts_outstanding_, flushes_outstanding_,
          absl::FormatDuration(spec_.patience)));
    }
    if (!error_.ok()) return error_;
    WindowResult result;
    result.bytes = done_bytes_;
    result.writes = done_writes_;
    result.posts = done_posts_;
    result.flushes = flushes_posted_;
    result.elapsed = absl::FromChrono(end_ - start_);
    return result;
  }

 private:
  bool HasRoom(const Lane& lane, uint64_t bytes) const {
    if (lane.posts >= spec_.posts_per_lane) return false;
    return lane.inflight() == 0 || lane.inflight() + bytes <= spec_.inflight_bytes_per_lane;
  }

  void StopLocked(absl::Status status) {
    if (!status.ok() && error_.ok()) error_ = std::move(status);
    stopped_ = true;
    for (Lane& lane : lanes_) lane.queue.clear();
    queued_posts_ = 0;
  }

  // Deals the slices of one batch to the lanes in turn and cuts each lane's share into posts.
  void GenerateBatchLocked() {
    std::vector<Post>& open = open_;  // empty between calls; kept for its capacity
    for (int i = 0; i < spec_.batch; ++i) {
      const uint64_t slot = next_write_++ % slots_;
      const uint64_t src = spec_.source_offset + slot * spec_.block_bytes;
      const uint64_t dst = spec_.destination_address + slot * spec_.block_bytes;
      for (uint64_t off = 0; off < spec_.block_bytes; off += spec_.slice_bytes) {
        const uint64_t length = std::min(spec_.slice_bytes, spec_.block_bytes - off);
        // A destination slice always goes to the same lane, so two lanes never write the same
        // bytes at once (over shared memory their cores would fight over the cache lines) and
        // writes to the same bytes stay in posting order.
        const int lane = static_cast<int>((slot * slices_per_block_ + off / spec_.slice_bytes) %
                                          static_cast<uint64_t>(spec_.lanes));
        Post& post = open[lane];
        if (!post.writes.empty() && post.bytes + length > spec_.post_bytes) {
          lanes_[lane].queue.push_back(std::move(post));
          ++queued_posts_;
          post = Post();
        }
        post.writes.push_back(Write{src + off, dst + off, length});
        post.bytes += length;
      }
    }
    for (int lane = 0; lane < spec_.lanes; ++lane) {
      if (open[lane].writes.empty()) continue;
      lanes_[lane].queue.push_back(std::move(open[lane]));
      ++queued_posts_;
      open[lane] = Post();
    }
    generated_bytes_ += spec_.block_bytes * static_cast<uint64_t>(spec_.batch);
    if (spec_.max_bytes > 0 && generated_bytes_ >= spec_.max_bytes) stopped_ = true;
  }

  void PostLocked(int index) {
    Lane& lane = lanes_[index];
    Post post = std::move(lane.queue.front());
    lane.queue.pop_front();
    --queued_posts_;
    const uint64_t bytes = post.bytes;
    Pending* pending = NewPendingLocked(index, bytes, post.writes.size());
    calls_[index].queued.push_back(Action{false, std::move(post), pending});
    ++lane.posts;
    ++posts_outstanding_;
    lane.unflushed += bytes;
    if (lane.unflushed >= flush_bytes_) FlushLaneLocked(index);
  }

  // Flushes what `lane` posted since its last flush; those bytes stay in flight until it
  // completes.
  void FlushLaneLocked(int index) {
    Lane& lane = lanes_[index];
    const uint64_t covered = std::exchange(lane.unflushed, 0);
    lane.flushing += covered;
    ++lane.flushes;
    ++flushes_outstanding_;
    ++flushes_posted_;
    calls_[index].queued.push_back(Action{true, Post(), NewPendingLocked(index, covered, 0)});
  }

  Pending* NewPendingLocked(int lane, uint64_t bytes, uint64_t writes) {
    if (spare_.empty()) {
      pending_.push_back(std::make_unique<Pending>());
      spare_.push_back(pending_.back().get());
    }
    Pending* pending = spare_.back();
    spare_.pop_back();
    *pending = Pending{lane, bytes, writes};
    return pending;
  }

  // Takes back the counts of an action that never reached the transport.
  void UndoLocked(int index, const Action& action) {
    Lane& lane = lanes_[index];
    spare_.push_back(action.pending);
    if (action.flush) {
      lane.flushing -= action.pending->bytes;
      --lane.flushes;
      --flushes_outstanding_;
      --flushes_posted_;
    } else {
      --lane.posts;
      --posts_outstanding_;
    }
  }

  // Makes the lanes' queued calls (engine/transfer/lane_calls.h): a thread sends its own
  // lane's (`self`, the lane of the completion it runs in; -1 for the caller) outside the lock,
  // so lanes post from their own progress threads at once (over shared memory a post is the
  // copy). After an error nothing more is sent.
  void SendLocked(std::unique_lock<std::mutex>& lock, int self) {
    struct Hooks {
      Window& window;
      bool Keep(const Action&) { return window.error_.ok(); }
      void Undo(int lane, const Action& action) { window.UndoLocked(lane, action); }
      void Taking(const Action&) {}
      void Taken(const Action&) {}
      absl::Status Issue(int lane, const Action& action) { return window.Issue(lane, action); }
      void Failed(int, Action&, absl::Status status) { window.StopLocked(std::move(status)); }
    } hooks{*this};
    transfer::SendLaneCalls(lock, calls_, self, hooks);
    if (!error_.ok() && posts_outstanding_ == 0 && flushes_outstanding_ == 0) FinishLocked();
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
  // count rises before the completion takes mu_ (where it may finish the window) and falls
  // after it has released it, as the completion's last touch of the window.
  void Entered() { callbacks_.fetch_add(1, std::memory_order_relaxed); }
  void Left() { callbacks_.fetch_sub(1, std::memory_order_release); }

  void PumpLocked() {
    if (!stopped_ && CoarseNow() >= deadline_) {
      // A batch larger than the window is measured in part: what is not posted is dropped.
      StopLocked(absl::OkStatus());
    }
    bool progress = true;
    while (progress) {
      progress = false;
      for (int index = 0; index < spec_.lanes; ++index) {
        Lane& lane = lanes_[index];
        while (!lane.queue.empty() && HasRoom(lane, lane.queue.front().bytes)) {
          PostLocked(index);
          progress = true;
        }
        // Full of bytes nobody has asked about: ask, so that room comes back.
        if (!lane.queue.empty() && lane.flushes == 0 && lane.unflushed > 0 &&
            lane.posts < spec_.posts_per_lane) {
          FlushLaneLocked(index);
        }
        // A lane with room and nothing queued asks for the next batch, unless plenty is
        // queued already for the other lanes.
        if (lane.queue.empty() && !stopped_ && HasRoom(lane, 0) &&
            queued_posts_ < spec_.lanes * spec_.posts_per_lane) {
          GenerateBatchLocked();
          progress = true;
        }
      }
    }
    if (!stopped_ || queued_posts_ > 0 || posts_outstanding_ > 0) return;
    if (!error_.ok()) {
      if (flushes_outstanding_ == 0) FinishLocked();
      return;
    }
    if (!final_flush_started_) {
      // The window's end: a Flush of every lane, so that every byte counted has landed.
      final_flush_started_ = true;
      for (int index = 0; index < spec_.lanes && error_.ok(); ++index) FlushLaneLocked(index);
      if (flushes_outstanding_ == 0) FinishLocked();
    }
  }

  void OnPostDone(Pending* pending, absl::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    const int index = pending->lane;
    const uint64_t bytes = pending->bytes;
    const uint64_t writes = pending->writes;
    spare_.push_back(pending);
    --calls_[index].live;
    --lanes_[index].posts;
    --posts_outstanding_;
    if (status.ok()) {
      done_bytes_ += bytes;
      done_writes_ += writes;
      ++done_posts_;
    } else {
      StopLocked(std::move(status));
    }
    PumpLocked();
    SendLocked(lock, index);
  }

  void OnFlushDone(Pending* pending, absl::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    const int index = pending->lane;
    const uint64_t covered = pending->bytes;
    spare_.push_back(pending);
    Lane& lane = lanes_[index];
    --calls_[index].live;
    lane.flushing -= covered;
    --lane.flushes;
    --flushes_outstanding_;
    if (!status.ok()) StopLocked(std::move(status));
    if (final_flush_started_ || !error_.ok()) {
      if (flushes_outstanding_ == 0 && posts_outstanding_ == 0) FinishLocked();
    } else {
      PumpLocked();
    }
    SendLocked(lock, index);
  }

  void FinishLocked() {
    if (finished_) return;
    end_ = Clock::now();
    finished_ = true;
    done_.notify_all();
  }

  Transport& transport_;
  const PeerId peer_;
  const RegionId source_;
  const WindowSpec spec_;
  const uint64_t slots_;
  const uint64_t slices_per_block_;
  const uint64_t flush_bytes_;

  std::mutex mu_;
  std::condition_variable done_;
  // Guarded by mu_:
  std::vector<Lane> lanes_;
  std::vector<transfer::LaneCalls<Action>> calls_;  // per lane
  std::vector<Post> open_;                          // GenerateBatchLocked's, per lane
  std::vector<std::unique_ptr<Pending>> pending_;   // every Pending made
  std::vector<Pending*> spare_;                     // those no call holds
  bool abandoned_ = false;                          // Run gave up waiting for the transport
  int queued_posts_ = 0;
  int posts_outstanding_ = 0;
  int flushes_outstanding_ = 0;
  uint64_t flushes_posted_ = 0;
  uint64_t next_write_ = 0;
  uint64_t generated_bytes_ = 0;
  uint64_t done_bytes_ = 0;
  uint64_t done_writes_ = 0;
  uint64_t done_posts_ = 0;
  bool stopped_ = false;
  bool final_flush_started_ = false;
  bool finished_ = false;
  absl::Status error_;
  Clock::time_point start_;
  Clock::time_point deadline_;
  Clock::time_point end_;
  std::atomic<int> callbacks_{0};  // completions running now
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
  if (window->Abandoned()) {
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
