#include "engine/transfer/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/memory/pattern.h"
#include "engine/transport/loopback/loopback_transport.h"

namespace kvrail::transfer {
namespace {

using transport::Completion;
using transport::LoopbackOptions;
using transport::LoopbackTransport;
using transport::PeerId;
using transport::RegionId;
using transport::Write;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Forwards to a real transport and watches what the scheduler does with it: bytes in flight
// per lane (posted, not yet locally complete), their maximum, and the calls made.
class WatchingTransport final : public transport::Transport {
 public:
  explicit WatchingTransport(transport::Transport* inner)
      : inner_(inner), capabilities_(inner->capabilities()) {
    inflight_.assign(inner->capabilities().lanes, 0);
  }
  const transport::Capabilities& capabilities() const override { return capabilities_; }
  // Before a scheduler is made: a backend whose disconnected links may still deliver (UCX).
  void DisconnectDoesNotFence() { capabilities_.disconnect_fences = false; }
  // Before a scheduler is made: a backend whose lanes' threads read the source (UCX over shared
  // memory or tcp).
  void LanesShareRows() { capabilities_.lanes_share_rows = true; }
  // Before a scheduler is made: a backend that takes one row a write (verbs).
  void TakesOneRowAWrite() { capabilities_.strided_writes = false; }
  // Before a scheduler is made: a backend that gathers up to `rows` rows into contiguous bytes
  // at the peer and takes no other strided write (verbs' scatter-gather lists).
  void GathersUpTo(uint32_t rows) {
    capabilities_.strided_writes = false;
    capabilities_.max_gather_rows = rows;
  }
  absl::StatusOr<RegionId> Register(const transport::LocalRegion& r) override {
    return inner_->Register(r);
  }
  absl::StatusOr<transport::SharedRegion> Allocate(uint64_t length) override {
    return inner_->Allocate(length);
  }
  absl::Status Deregister(RegionId r) override { return inner_->Deregister(r); }
  absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const override {
    return inner_->LocalDescriptor();
  }
  absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& d) override {
    return inner_->Connect(d);
  }
  absl::Status PostWrites(PeerId peer, int lane, RegionId source, absl::Span<const Write> writes,
                          Completion done) override {
    if (before_post) before_post();
    absl::Duration delay;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delay = post_delay_;
    }
    absl::SleepFor(delay);  // a slow post: it lands in the transport well after it was called
    uint64_t bytes = 0;
    for (const Write& w : writes) {
      bytes += transport::PayloadBytes(w);
      std::lock_guard<std::mutex> lock(mu_);
      max_write_ = std::max(max_write_, transport::PayloadBytes(w));
      max_rows_ = std::max(max_rows_, w.rows);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Write& w : writes) {
        if (w.remote_address >= forbidden_lo_ && w.remote_address < forbidden_hi_) ++late_;
      }
      inflight_[lane] += bytes;
      max_inflight_ = std::max(max_inflight_, inflight_[lane]);
      ++batches_;
      ++batches_on_[lane];
      posts_.push_back({peer, lane, writes.empty() ? 0 : writes.front().local_offset});
      writes_ += writes.size();
      lanes_seen_[lane] = true;
    }
    absl::Status posted = inner_->PostWrites(peer, lane, source, writes,
                                             [this, lane, bytes, done](absl::Status status) {
                                               {
                                                 std::lock_guard<std::mutex> lock(mu_);
                                                 inflight_[lane] -= bytes;
                                                 if (holding_ || lane == held_lane_) {
                                                   held_.emplace_back(done, std::move(status));
                                                   return;
                                                 }
                                               }
                                               done(std::move(status));
                                             });
    if (!posted.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      inflight_[lane] -= bytes;
    }
    return posted;
  }
  absl::Status Flush(PeerId peer, int lane, Completion done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++flushes_;
    }
    return inner_->Flush(peer, lane, [this, done](absl::Status status) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (holding_) {
          held_.emplace_back(done, std::move(status));
          return;
        }
      }
      done(std::move(status));
    });
  }
  // Called at the start of every PostWrites, on the posting thread; set before any Submit.
  std::function<void()> before_post;
  // Completions that arrive from now on wait until ReleaseCompletions (a peer that stalls).
  void HoldCompletions() {
    std::lock_guard<std::mutex> lock(mu_);
    holding_ = true;
  }
  // Completions of `lane`'s batches that arrive from now on wait until ReleaseCompletions (a
  // lane whose thread lost its core).
  void HoldLane(int lane) {
    std::lock_guard<std::mutex> lock(mu_);
    held_lane_ = lane;
  }
  // Runs the held completions (from the calling thread) and stops holding.
  void ReleaseCompletions() {
    std::vector<std::pair<Completion, absl::Status>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = false;
      held_lane_ = -1;
      held.swap(held_);
    }
    for (auto& [done, status] : held) done(std::move(status));
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  absl::Status Disconnect(PeerId peer) override { return inner_->Disconnect(peer); }
  void Close() override { inner_->Close(); }

  uint64_t max_inflight() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_inflight_;
  }
  uint64_t max_write() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_write_;
  }
  uint64_t max_rows() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_rows_;
  }
  uint64_t writes() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  uint64_t batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  uint64_t batches_on(int lane) {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_on_[lane];
  }
  uint64_t flushes() {
    std::lock_guard<std::mutex> lock(mu_);
    return flushes_;
  }
  // A PostWrites call: its peer, its lane and where its first write reads the source.
  struct Post {
    PeerId peer;
    int lane;
    uint64_t local_offset;
  };
  // Every PostWrites call so far, in the order they were made.
  std::vector<Post> posts() {
    std::lock_guard<std::mutex> lock(mu_);
    return posts_;
  }
  size_t lanes_seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return lanes_seen_.size();
  }
  // Every PostWrites takes `delay` before it is counted and reaches the inner transport.
  void SlowPosts(absl::Duration delay) {
    std::lock_guard<std::mutex> lock(mu_);
    post_delay_ = delay;
  }
  // From now on, counts writes posted into [lo, hi) (late()).
  void ForbidDestinations(uint64_t lo, uint64_t hi) {
    std::lock_guard<std::mutex> lock(mu_);
    forbidden_lo_ = lo;
    forbidden_hi_ = hi;
  }
  uint64_t late() {
    std::lock_guard<std::mutex> lock(mu_);
    return late_;
  }

 private:
  transport::Transport* inner_;
  transport::Capabilities capabilities_;
  std::mutex mu_;
  std::vector<uint64_t> inflight_;
  uint64_t max_inflight_ = 0;
  uint64_t max_write_ = 0;
  uint64_t max_rows_ = 0;
  uint64_t batches_ = 0;
  uint64_t writes_ = 0;
  uint64_t flushes_ = 0;
  std::map<int, bool> lanes_seen_;
  uint64_t forbidden_lo_ = 0;
  uint64_t forbidden_hi_ = 0;
  uint64_t late_ = 0;
  absl::Duration post_delay_;
  bool holding_ = false;
  int held_lane_ = -1;
  std::map<int, uint64_t> batches_on_;
  std::vector<Post> posts_;
  std::vector<std::pair<Completion, absl::Status>> held_;
};

// Waits for transfer outcomes.
class Outcomes {
 public:
  TransferDone Callback() {
    return [this](const TransferOutcome& outcome) {
      std::lock_guard<std::mutex> lock(mu_);
      EXPECT_EQ(outcomes_.count(outcome.transfer_id), 0u) << "called twice";
      outcomes_[outcome.transfer_id] = outcome;
      threads_.push_back(std::this_thread::get_id());
      changed_.notify_all();
    };
  }
  bool Wait(size_t count, absl::Duration timeout = absl::Seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                             [&] { return outcomes_.size() >= count; });
  }
  TransferOutcome Get(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_.at(id);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_.size();
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<uint64_t, TransferOutcome> outcomes_;
  std::vector<std::thread::id> threads_;
};

// A sender and a receiver loopback transport, a patterned source and a zeroed destination.
struct Fixture {
  // `registered`: the (offset, length) ranges of the destination the receiver registers, each
  // a region of its own; empty: the whole destination, one region.
  explicit Fixture(uint64_t bytes, LoopbackOptions options = {},
                   std::vector<std::pair<uint64_t, uint64_t>> registered = {})
      : source(bytes), destination(bytes, 0) {
    FillPattern(absl::MakeSpan(source), 5);
    sender = LoopbackTransport::Create(options).value();
    receiver = LoopbackTransport::Create(options).value();
    watch = std::make_unique<WatchingTransport>(sender.get());
    source_region = sender->Register({source.data(), source.size()}).value();
    if (registered.empty()) registered.emplace_back(0, bytes);
    for (const auto& [offset, length] : registered) {
      EXPECT_TRUE(receiver->Register({destination.data() + offset, length}).ok());
    }
    const v1::HandshakeDescriptor d = receiver->LocalDescriptor().value();
    peer = sender->Connect(d).value();
    regions = std::make_shared<const transport::RemoteRegions>(
        transport::RemoteRegions::FromDescriptor(d).value());
  }

  Transfer MakeTransfer(uint64_t id, CopyList copies, TransferDone done) {
    Transfer transfer;
    transfer.transfer_id = id;
    transfer.peer = peer;
    transfer.source = source_region;
    transfer.source_length = source.size();
    transfer.remote = regions;
    transfer.remote_base = reinterpret_cast<uintptr_t>(destination.data());
    transfer.copies = std::move(copies);
    transfer.done = std::move(done);
    return transfer;
  }

  std::vector<uint8_t> source;
  std::vector<uint8_t> destination;
  std::unique_ptr<LoopbackTransport> sender;
  std::unique_ptr<LoopbackTransport> receiver;
  std::unique_ptr<WatchingTransport> watch;
  RegionId source_region = 0;
  PeerId peer = 0;
  std::shared_ptr<const transport::RemoteRegions> regions;
};

// Copies of `length` bytes, every other chunk of the source, to shuffled destinations.
CopyList Scattered(uint64_t bytes, uint64_t length) {
  CopyList copies;
  const uint64_t n = bytes / length / 2;
  for (uint64_t i = 0; i < n; ++i) {
    copies.push_back({2 * i * length, (2 * ((i * 7) % n) + 1) * length, length});
  }
  return copies;
}

// Every destination byte of `copies` holds its source byte; every other byte is still 0.
void ExpectExactly(const Fixture& f, const CopyList& copies) {
  std::vector<bool> written(f.destination.size(), false);
  for (const Copy& c : copies) {
    ForEachRow(c, [&](uint64_t src, uint64_t dst, uint64_t length) {
      ASSERT_EQ(std::memcmp(&f.destination[dst], &f.source[src], length), 0) << "row to " << dst;
      std::fill(written.begin() + dst, written.begin() + dst + length, true);
    });
  }
  for (size_t i = 0; i < f.destination.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(f.destination[i], 0) << "byte " << i << " was written";
    }
  }
}

TEST(SchedulerTest, MovesATransferExactlyAndReportsItsStats) {
  Fixture f(8 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const CopyList copies = Scattered(8 * kMiB, 64 * kKiB);
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.bytes, 4 * kMiB);
  EXPECT_EQ(outcome.stats.copies, copies.size());
  EXPECT_EQ(outcome.stats.writes, copies.size());
  EXPECT_GE(outcome.stats.batches, 1u);
  EXPECT_GE(outcome.stats.lanes_used, 1u);
  EXPECT_GT(outcome.stats.duration, absl::ZeroDuration());
  ExpectExactly(f, copies);
  const SchedulerStats stats = scheduler.stats();
  EXPECT_EQ(stats.transfers_ok, 1u);
  EXPECT_EQ(stats.bytes_landed, 4 * kMiB);
  // Success means landed: every lane the transfer used was flushed.
  EXPECT_EQ(f.watch->flushes(), outcome.stats.lanes_used);
}

TEST(SchedulerTest, SlicesLongCopiesAndStripesThemOverEveryLane) {
  Fixture f(32 * kMiB);
  f.sender->DelayCompletions(absl::Milliseconds(20));  // keep lanes busy so striping shows
  SchedulerOptions options;
  options.slice_bytes = 1 * kMiB;
  options.max_inflight_bytes_per_endpoint = 2 * kMiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  const CopyList copies = {{0, 0, 32 * kMiB}};
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.writes, 32u);
  EXPECT_EQ(f.watch->max_write(), 1 * kMiB);
  EXPECT_EQ(f.watch->lanes_seen(), 4u);
  EXPECT_EQ(outcome.stats.lanes_used, 4u);
  ExpectExactly(f, copies);
}

// A transfer smaller than the lanes' in-flight bounds together (one layer of a layer-wise room)
// is still spread over every lane, a share each, rather than posted as one batch on one lane.
TEST(SchedulerTest, ATransferBelowTheLanesBoundsTogetherStillTakesEveryLane) {
  Fixture f(16 * kMiB);
  f.sender->DelayCompletions(absl::Milliseconds(20));  // no lane frees up meanwhile
  SchedulerOptions options;
  options.slice_bytes = 1 * kMiB;
  options.max_inflight_bytes_per_endpoint = 64 * kMiB;  // one lane could take it all
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  const CopyList copies = {{0, 0, 8 * kMiB}, {8 * kMiB, 8 * kMiB, 8 * kMiB}};
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.lanes_used, 4u);
  EXPECT_EQ(outcome.stats.batches, 4u);  // 16 MiB over 4 lanes: 4 MiB a lane
  EXPECT_EQ(f.watch->lanes_seen(), 4u);
  ExpectExactly(f, copies);
}

// A transfer given a set of lanes (one of several writers into a peer: lane_set.h) posts and
// flushes on those lanes alone, and its share per lane counts only them.
TEST(SchedulerTest, ATransferPostsOnlyOnItsLanes) {
  Fixture f(16 * kMiB);
  f.sender->DelayCompletions(absl::Milliseconds(20));  // no lane frees up meanwhile
  SchedulerOptions options;
  options.slice_bytes = 1 * kMiB;
  options.max_inflight_bytes_per_endpoint = 64 * kMiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  const CopyList copies = {{0, 0, 8 * kMiB}, {8 * kMiB, 8 * kMiB, 8 * kMiB}};
  Transfer transfer = f.MakeTransfer(1, copies, outcomes.Callback());
  transfer.lanes = LaneSet{.first = 1, .step = 2};  // lanes 1 and 3 of 4
  ASSERT_TRUE(scheduler.Submit(std::move(transfer)).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.lanes_used, 2u);
  EXPECT_EQ(outcome.stats.batches, 2u);  // 16 MiB over its 2 lanes: 8 MiB a lane
  EXPECT_EQ(f.watch->batches_on(0), 0u);
  EXPECT_EQ(f.watch->batches_on(2), 0u);
  EXPECT_EQ(f.watch->batches_on(1), 1u);
  EXPECT_EQ(f.watch->batches_on(3), 1u);
  EXPECT_EQ(f.watch->flushes(), 2u);  // each lane it used, and only those
  ExpectExactly(f, copies);
}

TEST(SchedulerTest, ALaneSetThatHoldsNoLaneIsRefusedAndWritesNothing) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const LaneSet refused[] = {{.first = 4, .step = 1},
                             {.first = 0, .step = 0},
                             {.first = -1, .step = 1},
                             {.first = 7, .step = 3}};
  uint64_t id = 1;
  for (const LaneSet& lanes : refused) {
    Transfer transfer = f.MakeTransfer(id++, {{0, 0, 4096}}, outcomes.Callback());
    transfer.lanes = lanes;
    const absl::Status status = scheduler.Submit(std::move(transfer));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                testing::HasSubstr("hold none of the transport's 4 lanes"));
    EXPECT_THAT(std::string(status.message()), testing::HasSubstr("nothing was written"));
  }
  EXPECT_EQ(scheduler.stats().transfers_rejected, 4u);
  EXPECT_EQ(f.watch->writes(), 0u);
  EXPECT_EQ(outcomes.size(), 0u);
  EXPECT_TRUE(
      std::all_of(f.destination.begin(), f.destination.end(), [](uint8_t b) { return b == 0; }));
}

// Work follows the lanes that complete: with a lane's in-flight bound at one batch (shared
// memory's, 1 MiB: ucx_context.cc), a lane whose writes do not complete (its thread off its
// core, a slow peer) is given nothing more of the transfer, and the lanes that complete carry
// the rest. So one layer of a layer-wise room waits for one slow batch, not for a slow lane's
// fixed share of the layer.
TEST(SchedulerTest, WorkFollowsTheLanesThatComplete) {
  Fixture f(16 * kMiB);
  f.watch->HoldLane(1);
  SchedulerOptions options;
  options.slice_bytes = 1 * kMiB;
  options.max_inflight_bytes_per_endpoint = 1 * kMiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  const CopyList copies = {{0, 0, 16 * kMiB}};
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback())).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (f.watch->batches() < 16 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(f.watch->batches(), 16u);
  EXPECT_EQ(outcomes.size(), 0u);  // lane 1's batch has not completed
  EXPECT_EQ(f.watch->batches_on(1), 1u);
  EXPECT_EQ(f.watch->batches_on(0) + f.watch->batches_on(2) + f.watch->batches_on(3), 15u);
  f.watch->ReleaseCompletions();
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.batches, 16u);
  ExpectExactly(f, copies);
}

// Where a lane shares passes over several peers' rows, a transfer's k-th batch goes to lane k mod
// its lanes while that lane has room, so two transfers cut alike (a prefill of the smaller TP
// sending each of two decode ranks its half of every source row) put their batches of the same
// rows on one lane, which stores them in one pass (decision 0020).
TEST(SchedulerTest, TransfersCutAlikePutTheirKthBatchesOnOneLane) {
  Fixture f(8 * kMiB);
  f.watch->LanesShareRows();
  const PeerId second = f.sender->Connect(f.receiver->LocalDescriptor().value()).value();
  SchedulerOptions options;
  options.max_writes_per_batch = 256;                   // rows: 256 KiB a batch
  options.max_inflight_bytes_per_endpoint = 64 * kMiB;  // no lane is ever full
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  // Each peer's half of every 2 KiB source row, into 4 MiB of its own.
  const uint64_t rows = 4 * kMiB / kKiB;
  const CopyList halves[2] = {{{0, 0, kKiB, rows, 2 * kKiB, kKiB}},
                              {{kKiB, 4 * kMiB, kKiB, rows, 2 * kKiB, kKiB}}};
  Transfer first = f.MakeTransfer(1, halves[0], outcomes.Callback());
  Transfer other = f.MakeTransfer(2, halves[1], outcomes.Callback());
  other.peer = second;
  ASSERT_TRUE(scheduler.Submit(std::move(first)).ok());
  ASSERT_TRUE(scheduler.Submit(std::move(other)).ok());
  ASSERT_TRUE(outcomes.Wait(2));
  ASSERT_TRUE(outcomes.Get(1).status.ok()) << outcomes.Get(1).status;
  ASSERT_TRUE(outcomes.Get(2).status.ok()) << outcomes.Get(2).status;
  EXPECT_EQ(outcomes.Get(1).stats.batches, 16u);
  EXPECT_EQ(outcomes.Get(2).stats.batches, 16u);
  // Each lane's calls are made in order, but the lanes' calls interleave as their threads
  // run: a batch is known by where it reads (256 rows of 2 KiB each).
  std::map<PeerId, std::map<uint64_t, int>> lane_of_batch;
  for (const WatchingTransport::Post& post : f.watch->posts()) {
    const uint64_t shift = post.peer == second ? kKiB : 0;
    ASSERT_EQ((post.local_offset - shift) % (512 * kKiB), 0u) << post.local_offset;
    lane_of_batch[post.peer][(post.local_offset - shift) / (512 * kKiB)] = post.lane;
  }
  ASSERT_EQ(lane_of_batch[f.peer].size(), 16u);
  ASSERT_EQ(lane_of_batch[second].size(), 16u);
  for (uint64_t k = 0; k < 16; ++k) {
    EXPECT_EQ(lane_of_batch[f.peer][k], static_cast<int>(k % 4)) << "batch " << k;
    EXPECT_EQ(lane_of_batch[second][k], static_cast<int>(k % 4)) << "batch " << k;
  }
  ExpectExactly(f, {halves[0][0], halves[1][0]});
}

TEST(SchedulerTest, NeverExceedsTheInflightBoundPerEndpoint) {
  Fixture f(16 * kMiB);
  f.sender->DelayCompletions(absl::Milliseconds(2));
  SchedulerOptions options;
  options.slice_bytes = 256 * kKiB;
  options.max_inflight_bytes_per_endpoint = 768 * kKiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  std::vector<CopyList> transfers;
  for (uint64_t r = 0; r < 4; ++r) {
    transfers.push_back({{r * 4 * kMiB, r * 4 * kMiB, 4 * kMiB}});
    ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(r, transfers.back(), outcomes.Callback())).ok());
  }
  ASSERT_TRUE(outcomes.Wait(4));
  for (uint64_t r = 0; r < 4; ++r) EXPECT_TRUE(outcomes.Get(r).status.ok());
  EXPECT_LE(f.watch->max_inflight(), 768 * kKiB);
  EXPECT_GT(f.watch->max_inflight(), 0u);
  EXPECT_EQ(std::memcmp(f.source.data(), f.destination.data(), f.source.size()), 0);
}

TEST(SchedulerTest, ASliceLargerThanTheBoundStillGoesOutAlone) {
  Fixture f(4 * kMiB);
  SchedulerOptions options;
  options.slice_bytes = 2 * kMiB;
  options.max_inflight_bytes_per_endpoint = 1 * kMiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4 * kMiB}}, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_TRUE(outcomes.Get(1).status.ok());
  EXPECT_EQ(f.watch->max_inflight(), 2 * kMiB);
}

// remote_length bounds a transfer to its destination's arena, inside a larger registered region:
// a copy past it is refused though the region would hold it.
TEST(SchedulerTest, ACopyPastTheDestinationsArenaRejectsTheTransfer) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  Transfer transfer = f.MakeTransfer(1, {{0, 0, 4096}, {0, 64 * 1024, 4096}}, outcomes.Callback());
  transfer.remote_length = 64 * 1024;  // the arena: the region's first 64 KiB
  const absl::Status status = scheduler.Submit(std::move(transfer));
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("copy 1 of 2"), std::string::npos) << status;
  EXPECT_NE(status.message().find("outside the destination's arena of 65536 bytes"),
            std::string::npos)
      << status;
  EXPECT_EQ(f.watch->batches(), 0u);
}

TEST(SchedulerTest, OutOfBoundsDestinationRejectsTheTransferAndWritesNothing) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  // The last copy runs one byte past the destination region.
  const CopyList copies = {{0, 0, 4096}, {4096, 1 * kMiB - 4095, 4096}};
  const absl::Status status = scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback()));
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("copy 1 of 2"), std::string::npos) << status;
  EXPECT_NE(status.message().find("nothing was written"), std::string::npos) << status;
  EXPECT_EQ(f.watch->batches(), 0u);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(outcomes.size(), 0u);
  EXPECT_TRUE(
      std::all_of(f.destination.begin(), f.destination.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(scheduler.stats().transfers_rejected, 1u);
}

TEST(SchedulerTest, RejectsBadSourceRangesZeroLengthsAndOverflowingOffsets) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const std::vector<std::pair<CopyList, std::string>> cases = {
      {{{1 * kMiB - 10, 0, 20}}, "source"},
      {{{0, 0, 0}}, "length 0"},
      {{{0, ~uint64_t{0} - 5, 4096}}, "destination"},
  };
  for (const auto& [copies, reason] : cases) {
    const absl::Status status = scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(reason), std::string::npos) << status;
  }
  EXPECT_EQ(f.watch->batches(), 0u);
  Transfer no_done = f.MakeTransfer(2, {{0, 0, 16}}, nullptr);
  EXPECT_EQ(scheduler.Submit(std::move(no_done)).code(), absl::StatusCode::kInvalidArgument);
  Transfer no_remote = f.MakeTransfer(3, {{0, 0, 16}}, outcomes.Callback());
  no_remote.remote = nullptr;
  EXPECT_EQ(scheduler.Submit(std::move(no_remote)).code(), absl::StatusCode::kInvalidArgument);
}

// The bounds check passes a transfer by its envelope in one pass, and checks copy by copy only a
// transfer whose envelope is not inside one region: then it still accepts copies that each lie in
// a region (two regions with a gap between them), and names the one bad copy of many.
TEST(SchedulerTest, ChecksEachCopyWhereTheEnvelopeSpansTwoRegions) {
  Fixture f(1 * kMiB, {}, {{0, 512 * kKiB}, {768 * kKiB, 256 * kKiB}});
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  CopyList both;
  for (uint64_t i = 0; i < 64; ++i) both.push_back({i * 1024, i * 2048, 1024});
  for (uint64_t i = 0; i < 64; ++i) both.push_back({(64 + i) * 1024, 768 * kKiB + i * 2048, 1024});
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, both, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_TRUE(outcomes.Get(1).status.ok()) << outcomes.Get(1).status;
  ExpectExactly(f, both);
  CopyList gap;
  for (uint64_t i = 0; i < 100000; ++i) gap.push_back({(i % 512) * 1024, (i % 256) * 2048, 1024});
  gap[77777] = {0, 600 * kKiB, 1024};  // inside the gap between the regions
  const absl::Status status = scheduler.Submit(f.MakeTransfer(2, gap, outcomes.Callback()));
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("copy 77777 of 100000"), std::string::npos) << status;
  EXPECT_NE(status.message().find("lies inside none of the peer's 2 registered regions"),
            std::string::npos)
      << status;
}

// A copy source over a fixed list, handing out at most `chunk` copies a call, with the
// envelope it is given (the tight one of its copies by default).
class ListSource : public CopySource {
 public:
  explicit ListSource(CopyList copies, size_t chunk = 1000)
      : copies_(std::move(copies)), chunk_(chunk) {
    envelope_.src_begin = envelope_.dst_begin = UINT64_MAX;
    for (const Copy& c : copies_) {
      envelope_.src_begin = std::min(envelope_.src_begin, c.src_offset);
      envelope_.src_end = std::max(envelope_.src_end, c.src_offset + SourceSpan(c));
      envelope_.dst_begin = std::min(envelope_.dst_begin, c.dst_offset);
      envelope_.dst_end = std::max(envelope_.dst_end, c.dst_offset + DestinationSpan(c));
      envelope_.bytes += PayloadBytes(c);
      ++envelope_.copies;
    }
  }
  CopyEnvelope& mutable_envelope() { return envelope_; }
  CopyEnvelope envelope() const override { return envelope_; }
  size_t Next(Copy* out, size_t capacity) override {
    const size_t n = std::min({capacity, chunk_, copies_.size() - next_});
    std::copy(copies_.begin() + next_, copies_.begin() + next_ + n, out);
    next_ += n;
    return n;
  }

 private:
  CopyList copies_;
  size_t chunk_;
  size_t next_ = 0;
  CopyEnvelope envelope_;
};

Transfer Streamed(Fixture& f, uint64_t id, std::unique_ptr<CopySource> source, TransferDone done) {
  Transfer transfer = f.MakeTransfer(id, {}, std::move(done));
  transfer.stream = std::move(source);
  return transfer;
}

// A streamed transfer lands exactly as its list would, pulled a chunk at a time (more chunks than
// one of the scheduler's), and reports every copy.
// Head-sliced pages (issue 31): `pages` strided copies of 16 rows of 1 KiB, the source rows
// contiguous, the destination's every other KiB (a prefill rank of TP 2 into a decode of TP 1).
CopyList HeadSliced(uint64_t pages) {
  CopyList copies;
  for (uint64_t p = 0; p < pages; ++p) {
    copies.push_back(Copy{.src_offset = p * 16 * kKiB,
                          .dst_offset = p * 32 * kKiB + 512,
                          .length = kKiB,
                          .rows = 16,
                          .src_stride = kKiB,
                          .dst_stride = 2 * kKiB});
  }
  return copies;
}

// A strided copy goes to a transport that takes rows as whole strided writes (never cut into
// rows), sliced by whole rows where it is longer than the slice, and every row lands where it
// belongs and nothing else is written; listed or streamed alike.
TEST(SchedulerTest, StridedCopiesGoOutAsStridedWritesAndLandExactly) {
  Fixture f(8 * kMiB);
  SchedulerOptions options;
  options.slice_bytes = 8 * kKiB;  // half a page: each page is two writes of 8 rows
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  const CopyList copies = HeadSliced(128);  // 2 MiB of payload over 4 MiB of destination
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.bytes, 2 * kMiB);
  EXPECT_EQ(outcome.stats.copies, 128u);
  EXPECT_EQ(outcome.stats.writes, 256u);
  EXPECT_EQ(f.watch->max_rows(), 8u);
  EXPECT_EQ(f.watch->max_write(), 8 * kKiB);
  ExpectExactly(f, copies);
  ASSERT_TRUE(
      scheduler.Submit(Streamed(f, 2, std::make_unique<ListSource>(copies, 5), outcomes.Callback()))
          .ok());
  ASSERT_TRUE(outcomes.Wait(2));
  ASSERT_TRUE(outcomes.Get(2).status.ok()) << outcomes.Get(2).status;
  EXPECT_EQ(outcomes.Get(2).stats.bytes, 2 * kMiB);
  ExpectExactly(f, copies);
}

// A transport that takes one row a write (verbs) gets a strided copy's rows one by one.
TEST(SchedulerTest, ATransportOfOneRowAWriteGetsAStridedCopysRows) {
  Fixture f(8 * kMiB);
  f.watch->TakesOneRowAWrite();
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const CopyList copies = HeadSliced(64);
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, copies, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  ASSERT_TRUE(outcomes.Get(1).status.ok()) << outcomes.Get(1).status;
  EXPECT_EQ(f.watch->max_rows(), 1u);
  EXPECT_EQ(f.watch->writes(), 64u * 16);
  ExpectExactly(f, copies);
}

// A transport that gathers rows into contiguous bytes (verbs' scatter-gather lists, here 6 a
// write) gets a source-strided copy landing back to back (a 1:2 route's) as writes of up to 6
// rows, and a destination-strided copy's rows one by one; both land exactly.
TEST(SchedulerTest, AGatheringTransportGetsSourceStridedRowsGatheredAndOthersOneByOne) {
  Fixture f(8 * kMiB);
  f.watch->GathersUpTo(6);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  CopyList gathered;
  for (uint64_t p = 0; p < 64; ++p) {
    gathered.push_back(Copy{.src_offset = p * 32 * kKiB + 512,
                            .dst_offset = p * 16 * kKiB,
                            .length = kKiB,
                            .rows = 16,
                            .src_stride = 2 * kKiB,
                            .dst_stride = kKiB});
  }
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, gathered, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  ASSERT_TRUE(outcomes.Get(1).status.ok()) << outcomes.Get(1).status;
  EXPECT_EQ(f.watch->max_rows(), 6u);
  EXPECT_EQ(f.watch->writes(), 64u * 3);  // 6 + 6 + 4 rows a page
  ExpectExactly(f, gathered);
  const CopyList apart = HeadSliced(16);
  std::fill(f.destination.begin(), f.destination.end(), 0);
  const uint64_t before = f.watch->writes();
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(2, apart, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(2));
  ASSERT_TRUE(outcomes.Get(2).status.ok()) << outcomes.Get(2).status;
  EXPECT_EQ(f.watch->writes() - before, 16u * 16);
  ExpectExactly(f, apart);
}

// A strided copy is checked by the span of its rows: one whose last row leaves the destination's
// arena, one whose rows overlap, and one of 0 rows are refused whole, naming the copy, and
// nothing is written.
TEST(SchedulerTest, AStridedCopyIsCheckedByItsRowsSpan) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const Copy last_row_out{.src_offset = 0,
                          .dst_offset = kMiB - 40 * kKiB,
                          .length = kKiB,
                          .rows = 16,
                          .src_stride = kKiB,
                          .dst_stride = 4 * kKiB};
  const Copy overlapping{.src_offset = 0,
                         .dst_offset = 0,
                         .length = kKiB,
                         .rows = 4,
                         .src_stride = kKiB,
                         .dst_stride = 512};
  const Copy no_rows{.src_offset = 0, .dst_offset = 0, .length = kKiB, .rows = 0};
  const std::vector<std::pair<Copy, std::string>> cases = {
      {last_row_out, "destination"}, {overlapping, "overlap"}, {no_rows, "0 rows"}};
  uint64_t id = 1;
  for (const auto& [bad, reason] : cases) {
    const absl::Status status =
        scheduler.Submit(f.MakeTransfer(id++, CopyList{{0, 0, 16}, bad}, outcomes.Callback()));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(reason), std::string::npos) << status;
    EXPECT_NE(status.message().find("copy 1 of 2"), std::string::npos) << status;
  }
  EXPECT_EQ(f.watch->batches(), 0u);
  EXPECT_TRUE(
      std::all_of(f.destination.begin(), f.destination.end(), [](uint8_t b) { return b == 0; }));
}

TEST(SchedulerTest, AStreamedTransferLandsExactly) {
  Fixture f(8 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const CopyList copies = Scattered(8 * kMiB, 512);  // 8,192 copies
  ASSERT_TRUE(
      scheduler
          .Submit(Streamed(f, 1, std::make_unique<ListSource>(copies, 777), outcomes.Callback()))
          .ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.stats.copies, copies.size());
  EXPECT_EQ(outcome.stats.bytes, 4 * kMiB);
  ExpectExactly(f, copies);
  // An empty source completes OK.
  ASSERT_TRUE(
      scheduler
          .Submit(Streamed(f, 2, std::make_unique<ListSource>(CopyList()), outcomes.Callback()))
          .ok());
  ASSERT_TRUE(outcomes.Wait(2));
  EXPECT_TRUE(outcomes.Get(2).status.ok());
}

// A stream is pulled 64 copies first, then twice as many each time the source filled the last
// pull, up to 4,096: a transfer of a few copies never makes a list for thousands.
TEST(SchedulerTest, AStreamIsPulledInChunksThatGrowWhileTheSourceFillsThem) {
  Fixture f(8 * kMiB);
  class RecordingSource : public ListSource {
   public:
    RecordingSource(CopyList copies, size_t chunk, std::vector<size_t>& asked)
        : ListSource(std::move(copies), chunk), asked_(asked) {}
    size_t Next(Copy* out, size_t capacity) override {
      asked_.push_back(capacity);
      return ListSource::Next(out, capacity);
    }

   private:
    std::vector<size_t>& asked_;
  };
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const CopyList copies = Scattered(8 * kMiB, 512);  // 8,192 copies
  std::vector<size_t> filled, short_handed;
  ASSERT_TRUE(scheduler
                  .Submit(Streamed(f, 1, std::make_unique<RecordingSource>(copies, 100000, filled),
                                   outcomes.Callback()))
                  .ok());
  ASSERT_TRUE(outcomes.Wait(1));
  ASSERT_TRUE(outcomes.Get(1).status.ok()) << outcomes.Get(1).status;
  ExpectExactly(f, copies);
  // 64 + 128 + ... + 4096 = 8128, then 64 copies left in a pull of 4096, then the end.
  EXPECT_EQ(filled, (std::vector<size_t>{64, 128, 256, 512, 1024, 2048, 4096, 4096, 4096}));
  // A source that hands out at most 100 a pull keeps the pull at 128.
  std::fill(f.destination.begin(), f.destination.end(), 0);
  ASSERT_TRUE(
      scheduler
          .Submit(Streamed(f, 2, std::make_unique<RecordingSource>(copies, 100, short_handed),
                           outcomes.Callback()))
          .ok());
  ASSERT_TRUE(outcomes.Wait(2));
  ASSERT_TRUE(outcomes.Get(2).status.ok()) << outcomes.Get(2).status;
  ASSERT_GE(short_handed.size(), 3u);
  EXPECT_EQ(short_handed[0], 64u);
  EXPECT_TRUE(std::all_of(short_handed.begin() + 1, short_handed.end(),
                          [](size_t asked) { return asked == 128; }));
}

// The first byte first: a streamed transfer's first writes are posted once its first chunks are
// pulled (a batch per lane), not once the in-flight bound is filled, which for small rows is
// the whole transfer here (4 MiB of 512-byte copies, under the default bound).
TEST(SchedulerTest, AStreamedTransfersFirstWritesGoOutBeforeTheBoundIsFilled) {
  Fixture f(8 * kMiB);
  std::atomic<size_t> handed{0};
  std::atomic<size_t> handed_at_first_post{0};
  f.watch->before_post = [&] {
    size_t none = 0;
    handed_at_first_post.compare_exchange_strong(none, handed.load());
  };
  // Counts the copies it has handed out.
  class CountingSource : public ListSource {
   public:
    CountingSource(CopyList copies, std::atomic<size_t>& handed)
        : ListSource(std::move(copies), 100), handed_(handed) {}
    size_t Next(Copy* out, size_t capacity) override {
      const size_t n = ListSource::Next(out, capacity);
      handed_ += n;
      return n;
    }

   private:
    std::atomic<size_t>& handed_;
  };
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const CopyList copies = Scattered(8 * kMiB, 512);  // 8,192 copies
  ASSERT_TRUE(scheduler
                  .Submit(Streamed(f, 1, std::make_unique<CountingSource>(copies, handed),
                                   outcomes.Callback()))
                  .ok());
  ASSERT_TRUE(outcomes.Wait(1));
  ASSERT_TRUE(outcomes.Get(1).status.ok()) << outcomes.Get(1).status;
  ExpectExactly(f, copies);
  EXPECT_GT(handed_at_first_post.load(), 0u);
  EXPECT_LE(handed_at_first_post.load(), copies.size() / 4)
      << "the first write waited for most of the transfer's copies";
}

// Bounds before bytes for a stream: an envelope outside the source, the peer's regions or the
// destination's arena, or a first chunk outside its envelope, rejects the transfer before any
// write; a list and a source together are refused.
TEST(SchedulerTest, AStreamsEnvelopeIsCheckedBeforeAnyWrite) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  const CopyList copies = {{0, 0, 4096}, {4096, 8192, 4096}};
  const auto source = [&](auto edit) {
    auto s = std::make_unique<ListSource>(copies);
    edit(s->mutable_envelope());
    return s;
  };
  struct Case {
    std::unique_ptr<CopySource> source;
    uint64_t remote_length;
    std::string reason;
  };
  std::vector<Case> cases;
  cases.push_back({source([](CopyEnvelope& e) { e.src_end = 2 * kMiB; }), 0, "source range"});
  cases.push_back({source([](CopyEnvelope& e) { e.dst_end = 2 * kMiB; }), 0, "none of the peer"});
  cases.push_back({source([](CopyEnvelope&) {}), 8192, "destination's arena of 8192"});
  cases.push_back({source([](CopyEnvelope& e) { e.dst_end = 4096; }), 0, "copy 1 of its source"});
  for (Case& c : cases) {
    Transfer transfer = Streamed(f, 1, std::move(c.source), outcomes.Callback());
    transfer.remote_length = c.remote_length;
    const absl::Status status = scheduler.Submit(std::move(transfer));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(c.reason), std::string::npos) << status;
    EXPECT_NE(status.message().find("nothing was written"), std::string::npos) << status;
  }
  Transfer both = Streamed(f, 1, std::make_unique<ListSource>(copies), outcomes.Callback());
  both.copies = copies;
  EXPECT_EQ(scheduler.Submit(std::move(both)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.watch->batches(), 0u);
  EXPECT_TRUE(
      std::all_of(f.destination.begin(), f.destination.end(), [](uint8_t b) { return b == 0; }));
}

// A source that breaks its envelope after the first chunk, or ends short of its bytes, fails
// the transfer (Internal), fenced like any failure; the copy outside the envelope is never posted.
TEST(SchedulerTest, AStreamThatBreaksItsEnvelopeFailsTheTransferWithoutPostingTheCopy) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  CopyList copies;
  for (uint64_t i = 0; i < 6000; ++i) copies.push_back({(i % 128) * 4096, (i % 64) * 4096, 64});
  copies[5000] = {0, 512 * kKiB, 64};  // in the region, outside the envelope given below
  auto breaking = std::make_unique<ListSource>(copies);
  breaking->mutable_envelope().dst_end = 256 * kKiB;
  ASSERT_TRUE(scheduler.Submit(Streamed(f, 1, std::move(breaking), outcomes.Callback())).ok());
  CopyList few = {{0, 0, 4096}};
  auto short_source = std::make_unique<ListSource>(few);
  short_source->mutable_envelope().bytes = 8192;
  ASSERT_TRUE(scheduler.Submit(Streamed(f, 2, std::move(short_source), outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(2));
  const TransferOutcome broke = outcomes.Get(1);
  EXPECT_EQ(broke.status.code(), absl::StatusCode::kInternal) << broke.status;
  EXPECT_NE(broke.status.message().find("copy 5000 of its source"), std::string::npos)
      << broke.status;
  EXPECT_TRUE(std::all_of(f.destination.begin() + 512 * kKiB, f.destination.end(),
                          [](uint8_t b) { return b == 0; }));
  const TransferOutcome ended = outcomes.Get(2);
  EXPECT_EQ(ended.status.code(), absl::StatusCode::kInternal) << ended.status;
  EXPECT_NE(ended.status.message().find("ended after 4096 bytes"), std::string::npos)
      << ended.status;
}

TEST(SchedulerTest, DuplicateTransferIdInFlightIsRejected) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Milliseconds(200));
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(7, {{0, 0, 4096}}, outcomes.Callback())).ok());
  EXPECT_EQ(scheduler.Submit(f.MakeTransfer(7, {{0, 4096, 4096}}, outcomes.Callback())).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_TRUE(outcomes.Get(7).status.ok());
  // Once done, the id may be used again.
  Outcomes later;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(7, {{0, 4096, 4096}}, later.Callback())).ok());
  ASSERT_TRUE(later.Wait(1));
  EXPECT_TRUE(later.Get(7).status.ok());
}

TEST(SchedulerTest, AnEmptyTransferCompletesOkAndNeverInline) {
  Fixture f(4096);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {}, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_TRUE(outcomes.Get(1).status.ok());
  for (auto id : outcomes.threads()) EXPECT_NE(id, std::this_thread::get_id());
}

// Completions delivered without a thread hop: the thread whose flush completion lands a transfer
// runs its `done`, before that completion returns.
TEST(SchedulerTest, ALandedTransferIsDeliveredByTheCompletionThatLandedIt) {
  Fixture f(64 * kKiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  f.watch->HoldCompletions();
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4096}}, outcomes.Callback())).ok());
  const auto held = [&](size_t n) {
    for (int i = 0; i < 3000 && f.watch->held() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
    return f.watch->held() == n;
  };
  ASSERT_TRUE(held(2));  // the batch's completion and the flush's, which followed it
  EXPECT_EQ(outcomes.size(), 0u);
  std::thread::id completing;
  size_t delivered_before_return = 0;
  std::thread completion([&] {
    completing = std::this_thread::get_id();
    f.watch->ReleaseCompletions();
    delivered_before_return = outcomes.size();
  });
  completion.join();
  EXPECT_EQ(delivered_before_return, 1u);
  ASSERT_EQ(outcomes.threads().size(), 1u);
  EXPECT_EQ(outcomes.threads()[0], completing);
  EXPECT_TRUE(outcomes.Get(1).status.ok());
  EXPECT_EQ(scheduler.transfers_in_flight(), 0u);
}

// A transfer's `done` may submit the next transfer from the completion's thread (a layer-wise
// transfer's next chunk, a bench's window), and that transfer lands too.
TEST(SchedulerTest, ADoneThatSubmitsFromTheCompletionThreadWorks) {
  Fixture f(1 * kMiB);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  std::function<void(uint64_t)> submit = [&](uint64_t id) {
    TransferDone done = [&, id, inner = outcomes.Callback()](const TransferOutcome& outcome) {
      inner(outcome);
      if (id < 20) submit(id + 1);
    };
    ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(id, {{id * 4096, id * 4096, 4096}}, done)).ok());
  };
  submit(1);
  ASSERT_TRUE(outcomes.Wait(20));
  for (uint64_t id = 1; id <= 20; ++id) EXPECT_TRUE(outcomes.Get(id).status.ok()) << id;
  EXPECT_EQ(scheduler.stats().transfers_ok, 20u);
}

TEST(SchedulerTest, ATransportFailureFailsTheTransferWithTheReason) {
  Fixture f(4 * kMiB);
  f.sender->FailNextWrites(1);
  Scheduler scheduler(f.watch.get());
  Outcomes outcomes;
  ASSERT_TRUE(
      scheduler.Submit(f.MakeTransfer(1, Scattered(4 * kMiB, 64 * kKiB), outcomes.Callback()))
          .ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = outcomes.Get(1);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kUnavailable) << outcome.status;
  EXPECT_NE(outcome.status.message().find("transfer 1"), std::string::npos);
  EXPECT_EQ(scheduler.stats().transfers_failed, 1u);
  // The scheduler keeps serving.
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(2, {{0, 0, 4096}}, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(2));
  EXPECT_TRUE(outcomes.Get(2).status.ok());
}

TEST(SchedulerTest, APeerThatDiesMidTransferFailsTheTransfer) {
  Fixture f(8 * kMiB);
  f.sender->KillPeerAfterWrites(f.receiver.get(), 10);
  SchedulerOptions options;
  options.slice_bytes = 64 * kKiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  Transfer transfer = f.MakeTransfer(1, {{0, 0, 8 * kMiB}}, outcomes.Callback());
  transfer.deadline = absl::Now() + absl::Seconds(20);
  ASSERT_TRUE(scheduler.Submit(std::move(transfer)).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_EQ(outcomes.Get(1).status.code(), absl::StatusCode::kUnavailable)
      << outcomes.Get(1).status;
  EXPECT_EQ(scheduler.transfers_in_flight(), 0u);
}

TEST(SchedulerTest, ATransferPastItsDeadlineFailsWithDeadlineExceeded) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Seconds(30));  // a peer that never answers
  Scheduler scheduler(f.watch.get(), {.fence_timeout = absl::Milliseconds(100)});
  Outcomes outcomes;
  Transfer transfer = f.MakeTransfer(1, {{0, 0, 1 * kMiB}}, outcomes.Callback());
  transfer.deadline = absl::Now() + absl::Milliseconds(100);
  ASSERT_TRUE(scheduler.Submit(std::move(transfer)).ok());
  ASSERT_TRUE(outcomes.Wait(1, absl::Seconds(10)));
  const TransferOutcome outcome = outcomes.Get(1);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(outcome.status.message().find("deadline"), std::string::npos) << outcome.status;
  // Its writes never completed: the fence disconnected the peer.
  EXPECT_TRUE(outcome.peer_disconnected);
  EXPECT_NE(outcome.status.message().find("disconnected"), std::string::npos) << outcome.status;
  EXPECT_EQ(scheduler.transfers_in_flight(), 0u);
  f.sender->Close();  // cut the delayed completions short
}

TEST(SchedulerTest, CancelFailsTheTransferOnceAndUnknownIdsAreNotFound) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Seconds(30));
  Scheduler scheduler(f.watch.get(), {.fence_timeout = absl::Milliseconds(100)});
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(4, {{0, 0, 1 * kMiB}}, outcomes.Callback())).ok());
  ASSERT_TRUE(scheduler.Cancel(4, "the engine aborted transfer 4").ok());
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_EQ(outcomes.Get(4).status.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(outcomes.Get(4).status.message().find("the engine aborted transfer 4"),
            std::string::npos);
  EXPECT_EQ(scheduler.Cancel(4).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler.Cancel(99).code(), absl::StatusCode::kNotFound);
  f.sender->Close();
}

// Lanes post outside the peer's lock, from their completion threads; still, once a cancelled
// transfer's outcome is out, no write of it is being posted or will be (its pages may go to another
// transfer).
TEST(SchedulerTest, NoWriteOfACancelledTransferStartsAfterItsOutcome) {
  constexpr uint64_t kHalf = 4 * kMiB;
  for (int round = 0; round < 20; ++round) {
    Fixture f(2 * kHalf);
    f.watch->SlowPosts(absl::Microseconds(100));
    Scheduler scheduler(f.watch.get(), {.slice_bytes = 64 << 10,
                                        .max_inflight_bytes_per_endpoint = 256 << 10,
                                        .max_writes_per_batch = 2});
    Outcomes outcomes;
    const uint64_t base = reinterpret_cast<uintptr_t>(f.destination.data());
    TransferDone record = outcomes.Callback();
    WatchingTransport* watch = f.watch.get();
    TransferDone forbid_then_record = [&, watch, base](const TransferOutcome& outcome) {
      watch->ForbidDestinations(base, base + kHalf);
      record(outcome);
    };
    ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, kHalf}}, forbid_then_record)).ok());
    ASSERT_TRUE(
        scheduler.Submit(f.MakeTransfer(2, {{kHalf, kHalf, kHalf}}, outcomes.Callback())).ok());
    absl::SleepFor(absl::Microseconds(100 * round));
    const absl::Status cancelled = scheduler.Cancel(1, "the engine aborted transfer 1");
    ASSERT_TRUE(outcomes.Wait(2));
    EXPECT_EQ(f.watch->late(), 0u) << "round " << round;
    if (cancelled.ok()) {
      EXPECT_EQ(outcomes.Get(1).status.code(), absl::StatusCode::kCancelled);
    }
    EXPECT_TRUE(outcomes.Get(2).status.ok()) << outcomes.Get(2).status;
    EXPECT_EQ(std::memcmp(f.source.data() + kHalf, f.destination.data() + kHalf, kHalf), 0);
  }
}

// Failed means fenced: a cancelled transfer's outcome waits until every write made for it has
// completed and a flush of its lanes came back after them.
TEST(SchedulerTest, ACancelledTransfersOutcomeWaitsForItsWritesAndAFenceFlush) {
  Fixture f(4 * kMiB);
  Scheduler scheduler(f.watch.get(), {.slice_bytes = 64 << 10,
                                      .max_inflight_bytes_per_endpoint = 128 << 10,
                                      .fence_timeout = absl::Hours(1)});
  Outcomes outcomes;
  f.watch->HoldCompletions();  // the peer stalls: nothing the scheduler posted completes
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4 * kMiB}}, outcomes.Callback())).ok());
  while (f.watch->held() == 0) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(scheduler.Cancel(1, "the engine aborted transfer 1").ok());
  const uint64_t flushes_before = f.watch->flushes();
  EXPECT_EQ(outcomes.size(), 0u) << "Failed before the transfer's writes completed";
  EXPECT_EQ(scheduler.transfers_in_flight(), 1u);
  f.watch->ReleaseCompletions();
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_EQ(outcomes.Get(1).status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(outcomes.Get(1).peer_disconnected);
  EXPECT_TRUE(outcomes.Get(1).fence_proven);
  EXPECT_GT(f.watch->flushes(), flushes_before) << "no fence flush after the cancel";
  // The scheduler keeps serving the same peer.
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(2, {{0, 0, 4096}}, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(2));
  EXPECT_TRUE(outcomes.Get(2).status.ok()) << outcomes.Get(2).status;
}

TEST(SchedulerTest, AFenceByDisconnectIsUnprovenWhereTheBackendsDisconnectDoesNotFence) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Hours(1));
  f.watch->DisconnectDoesNotFence();
  Scheduler scheduler(f.watch.get(), {.fence_timeout = absl::Milliseconds(50)});
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4096}}, outcomes.Callback())).ok());
  ASSERT_TRUE(scheduler.Cancel(1, "the engine aborted transfer 1").ok());
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_TRUE(outcomes.Get(1).peer_disconnected);
  EXPECT_FALSE(outcomes.Get(1).fence_proven);
}

TEST(SchedulerTest, AFenceThatDoesNotDrainDisconnectsThePeerAndFailsItsOtherTransfers) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Hours(1));  // writes land, completions never come
  Scheduler scheduler(f.watch.get(), {.fence_timeout = absl::Milliseconds(50)});
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4096}}, outcomes.Callback())).ok());
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(2, {{4096, 4096, 4096}}, outcomes.Callback())).ok());
  ASSERT_TRUE(scheduler.Cancel(1, "the engine aborted transfer 1").ok());
  ASSERT_TRUE(outcomes.Wait(2));
  EXPECT_EQ(outcomes.Get(1).status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(outcomes.Get(1).peer_disconnected);
  EXPECT_NE(outcomes.Get(1).status.message().find("fence timeout"), std::string::npos)
      << outcomes.Get(1).status;
  EXPECT_FALSE(outcomes.Get(2).status.ok());
  EXPECT_TRUE(outcomes.Get(2).peer_disconnected);
  // The peer id is gone; a transfer submitted to it fails and says why.
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(3, {{0, 0, 4096}}, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(3));
  EXPECT_EQ(outcomes.Get(3).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(outcomes.Get(3).status.message().find("disconnected"), std::string::npos);
}

TEST(SchedulerTest, FailPeerFailsOnlyThatPeersTransfers) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Seconds(30));
  Scheduler scheduler(f.watch.get(), {.fence_timeout = absl::Milliseconds(100)});
  Outcomes outcomes;
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4096}}, outcomes.Callback())).ok());
  scheduler.FailPeer(f.peer + 1, absl::UnavailableError("other peer"));
  scheduler.FailPeer(f.peer, absl::UnavailableError("decode sidecar stopped answering"));
  ASSERT_TRUE(outcomes.Wait(1));
  EXPECT_EQ(outcomes.Get(1).status.code(), absl::StatusCode::kUnavailable);
  f.sender->Close();
}

TEST(SchedulerTest, DestroyingTheSchedulerCancelsTransfersInFlight) {
  Fixture f(1 * kMiB);
  f.sender->DelayCompletions(absl::Seconds(30));
  Outcomes outcomes;
  {
    Scheduler scheduler(f.watch.get());
    for (uint64_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(
          scheduler.Submit(f.MakeTransfer(r, {{r * 4096, r * 4096, 4096}}, outcomes.Callback()))
              .ok());
    }
  }
  ASSERT_EQ(outcomes.size(), 3u);
  for (uint64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(outcomes.Get(r).status.code(), absl::StatusCode::kCancelled);
  }
  f.sender->Close();  // late completions find no scheduler, and are dropped
}

TEST(SchedulerTest, ManyConcurrentTransfersFromSeveralThreadsAllLandExactly) {
  constexpr uint64_t kTransfers = 64;
  Fixture f(16 * kMiB);
  SchedulerOptions options;
  options.slice_bytes = 32 * kKiB;
  options.max_inflight_bytes_per_endpoint = 256 * kKiB;
  Scheduler scheduler(f.watch.get(), options);
  Outcomes outcomes;
  std::vector<std::thread> threads;
  const uint64_t per_transfer = f.source.size() / kTransfers;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t r = t; r < kTransfers; r += 4) {
        CopyList copies = {{r * per_transfer, r * per_transfer, per_transfer}};
        EXPECT_TRUE(scheduler.Submit(f.MakeTransfer(r, copies, outcomes.Callback())).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(outcomes.Wait(kTransfers));
  for (uint64_t r = 0; r < kTransfers; ++r) ASSERT_TRUE(outcomes.Get(r).status.ok()) << r;
  EXPECT_EQ(std::memcmp(f.source.data(), f.destination.data(), f.source.size()), 0);
  EXPECT_EQ(scheduler.stats().transfers_ok, kTransfers);
}

}  // namespace
}  // namespace kvrail::transfer
