#include "bench/raw/write_window.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

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

// One PostWrites call: part of one lane's share of one batch.
struct Post {
  std::vector<Write> writes;
  uint64_t bytes = 0;
};

// A PostWrites or a Flush decided under the window's lock and made outside it.
struct Action {
  bool flush = false;
  Post post;             // !flush
  uint64_t covered = 0;  // flush: the bytes it covers
};

struct Lane {
  std::deque<Post> queue;  // posts of generated batches, not yet posted
  int posts = 0;           // PostWrites calls outstanding (queued in calls_ or made)
  uint64_t unflushed = 0;  // bytes posted since the lane's last Flush
  uint64_t flushing = 0;   // bytes covered by this lane's Flush calls outstanding
  int flushes = 0;         // Flush calls outstanding
  uint64_t inflight() const { return unflushed + flushing; }  // posted, not known landed
};

class Window : public std::enable_shared_from_this<Window> {
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
        calls_(spec.lanes) {}

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
    std::vector<Post> open(spec_.lanes);
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
    calls_[index].queued.push_back(Action{false, std::move(post), 0});
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
    calls_[index].queued.push_back(Action{true, Post(), covered});
  }

  // Takes back the counts of an action that never reached the transport.
  void UndoLocked(int index, const Action& action) {
    Lane& lane = lanes_[index];
    if (action.flush) {
      lane.flushing -= action.covered;
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

  absl::Status Issue(int index, const Action& action) {
    if (action.flush) {
      const uint64_t covered = action.covered;
      return transport_.Flush(peer_, index,
                              [self = shared_from_this(), index, covered](absl::Status s) {
                                self->OnFlushDone(index, covered, std::move(s));
                              });
    }
    const uint64_t bytes = action.post.bytes;
    const uint64_t writes = action.post.writes.size();
    return transport_.PostWrites(peer_, index, source_, action.post.writes,
                                 [self = shared_from_this(), index, bytes, writes](absl::Status s) {
                                   self->OnPostDone(index, bytes, writes, std::move(s));
                                 });
  }

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

  void OnPostDone(int index, uint64_t bytes, uint64_t writes, absl::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
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

  void OnFlushDone(int index, uint64_t covered, absl::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
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
  auto window = std::make_shared<Window>(transport, peer, source, spec);
  return window->Run();
}

}  // namespace kvrail::bench
