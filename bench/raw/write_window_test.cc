#include "bench/raw/write_window.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/memory/pattern.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/bounds.h"
#include "engine/transport/loopback/loopback_transport.h"
#include "engine/transport/transport.h"
#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

using transport::Completion;
using transport::LoopbackTransport;
using transport::PeerId;
using transport::RegionId;
using transport::Transport;
using transport::Write;

constexpr uint64_t kSeed = 77;

// Forwards to a real transport and records what the scheduler asked of it for the window, and
// which posts of each lane a completed Flush covers (landed).
class RecordingTransport final : public Transport {
 public:
  explicit RecordingTransport(Transport& inner) : inner_(inner) {}

  struct Event {
    bool flush = false;
    int lane = 0;
    uint64_t bytes = 0;
  };

  const transport::Capabilities& capabilities() const override { return inner_.capabilities(); }
  absl::StatusOr<RegionId> Register(const transport::LocalRegion& r) override {
    return inner_.Register(r);
  }
  absl::StatusOr<transport::SharedRegion> Allocate(uint64_t length) override {
    return inner_.Allocate(length);
  }
  absl::Status Deregister(RegionId r) override { return inner_.Deregister(r); }
  absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const override {
    return inner_.LocalDescriptor();
  }
  absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& p) override {
    return inner_.Connect(p);
  }
  absl::Status PostWrites(PeerId peer, int lane, RegionId source, absl::Span<const Write> writes,
                          Completion done) override {
    uint64_t bytes = 0;
    for (const Write& w : writes) bytes += w.length;
    {
      std::lock_guard<std::mutex> lock(mu_);
      LaneLog& log = lanes_[lane];
      events_.push_back({false, lane, bytes});
      log.posts.push_back(bytes);
    }
    return inner_.PostWrites(peer, lane, source, writes,
                             [this, done = std::move(done)](absl::Status s) mutable {
                               {
                                 std::lock_guard<std::mutex> lock(mu_);
                                 if (hold_) {
                                   held_.emplace_back(std::move(done), std::move(s));
                                   return;
                                 }
                               }
                               done(std::move(s));
                             });
  }
  absl::Status Flush(PeerId peer, int lane, Completion done) override {
    size_t covers = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back({true, lane, 0});
      covers = lanes_[lane].posts.size();
    }
    return inner_.Flush(peer, lane, [this, lane, covers, done = std::move(done)](absl::Status s) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (fail_flushes_ && s.ok()) s = absl::UnavailableError("recording: the flush failed");
        if (s.ok()) lanes_[lane].landed = std::max(lanes_[lane].landed, covers);
      }
      done(std::move(s));
    });
  }
  absl::Status Disconnect(PeerId peer) override { return inner_.Disconnect(peer); }
  void Close() override { inner_.Close(); }

  // From now on completions are kept, not delivered, until ReleaseHeld: a transport that has
  // stopped answering.
  void HoldCompletions() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  // Delivers what was held, as a transport that answers late; returns how many.
  size_t ReleaseHeld() {
    std::vector<std::pair<Completion, absl::Status>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_ = false;
      held.swap(held_);
    }
    for (auto& [done, status] : held) done(std::move(status));
    return held.size();
  }

  // From now on every flush reports a failure: its lane's writes are not known to have landed.
  void FailFlushes() {
    std::lock_guard<std::mutex> lock(mu_);
    fail_flushes_ = true;
  }

  // Bytes covered by flushes that completed OK, over every lane.
  uint64_t LandedBytes() {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t bytes = 0;
    for (const auto& [lane, log] : lanes_) {
      for (size_t i = 0; i < log.landed; ++i) bytes += log.posts[i];
    }
    return bytes;
  }

  std::vector<Event> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  struct LaneLog {
    std::vector<uint64_t> posts;  // bytes of every post, in order
    size_t landed = 0;            // posts [0, landed) are covered by a completed flush
  };
  Transport& inner_;
  std::mutex mu_;
  std::map<int, LaneLog> lanes_;
  std::vector<Event> events_;
  bool hold_ = false;
  bool fail_flushes_ = false;
  std::vector<std::pair<Completion, absl::Status>> held_;
};

class WriteWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sender_ = LoopbackTransport::Create({.lanes = 4}).value();
    receiver_ = LoopbackTransport::Create({.lanes = 4}).value();
    source_.resize(1 << 20);
    FillPattern(absl::MakeSpan(source_), kSeed);
    destination_.assign(1 << 20, 0);
    source_region_ = sender_->Register({source_.data(), source_.size()}).value();
    ASSERT_TRUE(receiver_->Register({destination_.data(), destination_.size()}).ok());
    const v1::HandshakeDescriptor descriptor = receiver_->LocalDescriptor().value();
    peer_ = sender_->Connect(descriptor).value();
    remote_ = std::make_shared<const transport::RemoteRegions>(
        transport::RemoteRegions::FromDescriptor(descriptor).value());
  }

  // The bench's scheduler settings on `transport`: 4 KiB slices, 8 KiB in flight per lane.
  std::unique_ptr<transfer::Scheduler> SchedulerOn(Transport& transport) {
    transfer::SchedulerOptions options;
    options.slice_bytes = 4096;
    options.max_inflight_bytes_per_endpoint = 8192;
    options.fence_timeout = absl::Milliseconds(50);
    return std::make_unique<transfer::Scheduler>(&transport, options);
  }

  WindowTarget Target() const {
    WindowTarget target;
    target.peer = peer_;
    target.source = source_region_;
    target.source_length = source_.size();
    target.remote = remote_;
    target.remote_base = reinterpret_cast<uintptr_t>(destination_.data());
    target.remote_length = destination_.size();
    return target;
  }

  WindowSpec Spec() const {
    WindowSpec spec;
    spec.block_bytes = 10000;  // not a multiple of the slice
    spec.batch = 5;
    spec.working_set = uint64_t{5} * 10000;
    spec.inflight_bytes = 3 * 8192;
    spec.duration = absl::Seconds(30);
    spec.max_bytes = uint64_t{5} * 10000;  // one batch
    return spec;
  }

  std::unique_ptr<LoopbackTransport> sender_;
  std::unique_ptr<LoopbackTransport> receiver_;
  std::vector<uint8_t> source_;
  std::vector<uint8_t> destination_;
  RegionId source_region_ = 0;
  PeerId peer_ = 0;
  std::shared_ptr<const transport::RemoteRegions> remote_;
};

TEST_F(WriteWindowTest, EveryByteOfABatchLandsAtItsOffset) {
  auto scheduler = SchedulerOn(*sender_);
  WindowSpec spec = Spec();
  spec.source_offset = 123;
  spec.destination_offset = 7;
  auto result = RunWriteWindow(*scheduler, Target(), spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, 50000u);
  EXPECT_EQ(result->blocks, 5u);
  EXPECT_EQ(result->transfers, 1u);   // a batch is a transfer
  EXPECT_EQ(result->writes, 5u * 3);  // 4096 + 4096 + 1808 per block
  EXPECT_GE(result->flushes, 1u);     // every lane the transfer used was flushed
  EXPECT_EQ(destination_[6], 0);      // nothing before the destination offset
  EXPECT_FALSE(FirstPatternMismatch(absl::MakeConstSpan(destination_.data() + 7, 50000), kSeed, 123)
                   .has_value());
  EXPECT_EQ(destination_[50007], 0);  // nothing past the working set
}

// A Flush covers every earlier write of its lane (Transport, "Fencing"): the scheduler queues it
// behind the transfer's posts, and the transfer's outcome waits for it.
TEST_F(WriteWindowTest, EveryLaneATransferUsedEndsWithAFlush) {
  RecordingTransport recorder(*sender_);
  auto scheduler = SchedulerOn(recorder);
  auto result = RunWriteWindow(*scheduler, Target(), Spec());
  ASSERT_TRUE(result.ok()) << result.status();
  const auto events = recorder.events();
  std::map<int, size_t> last;
  for (size_t i = 0; i < events.size(); ++i) last[events[i].lane] = i;
  ASSERT_GE(last.size(), 2u);  // 50000 B over lanes of 8 KiB in flight: striped
  for (const auto& [lane, index] : last) {
    EXPECT_TRUE(events[index].flush) << "lane " << lane;
  }
  EXPECT_EQ(result->flushes,
            static_cast<uint64_t>(std::count_if(events.begin(), events.end(),
                                                [](const auto& e) { return e.flush; })));
  EXPECT_EQ(result->bytes, recorder.LandedBytes());
}

TEST_F(WriteWindowTest, CountsOnlyBytesThatACompletedFlushCovers) {
  RecordingTransport recorder(*sender_);
  sender_->DelayCompletions(absl::Milliseconds(1));  // transfers overlap
  auto scheduler = SchedulerOn(recorder);
  WindowSpec spec = Spec();
  spec.max_bytes = 0;
  spec.duration = absl::Milliseconds(60);
  auto result = RunWriteWindow(*scheduler, Target(), spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->transfers, 1u);
  // Every transfer's bytes were flushed before its outcome: what the window counts is what landed.
  EXPECT_EQ(result->bytes, recorder.LandedBytes());
  EXPECT_EQ(result->bytes, result->blocks * spec.block_bytes);
}

TEST_F(WriteWindowTest, AFailedFlushEndsTheWindowAndCountsNothingOfItsTransfer) {
  RecordingTransport recorder(*sender_);
  recorder.FailFlushes();
  auto scheduler = SchedulerOn(recorder);
  auto result = RunWriteWindow(*scheduler, Target(), Spec());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
}

TEST_F(WriteWindowTest, AFailedWriteEndsTheWindowWithItsStatus) {
  auto scheduler = SchedulerOn(*sender_);
  sender_->FailNextWrites(1);
  WindowSpec spec = Spec();
  spec.max_bytes = 0;
  auto result = RunWriteWindow(*scheduler, Target(), spec);  // would run 30 s without the failure
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
}

TEST_F(WriteWindowTest, ABatchLargerThanATransferIsSentAsTransfersOfWholeBlocks) {
  auto scheduler = SchedulerOn(*sender_);
  WindowSpec spec = Spec();
  spec.max_transfer_bytes = 25000;  // two blocks
  auto result = RunWriteWindow(*scheduler, Target(), spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->transfers, 3u);  // 2 + 2 + 1 blocks
  EXPECT_EQ(result->bytes, 50000u);
  EXPECT_FALSE(
      FirstPatternMismatch(absl::MakeConstSpan(destination_.data(), 50000), kSeed, 0).has_value());
}

TEST_F(WriteWindowTest, ADurationWindowRunsAboutThatLongAndCountsWholeTransfers) {
  auto scheduler = SchedulerOn(*sender_);
  WindowSpec spec = Spec();
  spec.max_bytes = 0;
  spec.duration = absl::Milliseconds(50);
  auto result = RunWriteWindow(*scheduler, Target(), spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GE(result->elapsed, absl::Milliseconds(50));
  EXPECT_GT(result->bytes, 50000u);
  EXPECT_EQ(result->bytes, result->transfers * 50000);
  EXPECT_GT(result->gbps(), 0);
  EXPECT_GT(result->blocks_per_s(spec.block_bytes), 0);
  // The destination holds the source pattern throughout the working set.
  EXPECT_FALSE(
      FirstPatternMismatch(absl::MakeConstSpan(destination_.data(), 50000), kSeed, 0).has_value());
}

TEST(TransfersInFlight, HoldTheBytesInFlightWithAtLeastTwoAndAtMostTheCap) {
  WindowSpec spec;
  spec.block_bytes = 4096;
  spec.batch = 1;
  spec.inflight_bytes = 8 * 4096;
  spec.max_transfers = 128;
  EXPECT_EQ(TransfersInFlight(spec), 8);
  spec.max_transfers = 4;
  EXPECT_EQ(TransfersInFlight(spec), 4);
  spec.block_bytes = uint64_t{1} << 20;  // one transfer holds more than the bytes in flight
  EXPECT_EQ(TransfersInFlight(spec), 2);
  spec.block_bytes = uint64_t{64} << 20;  // transfers of at most max_transfer_bytes
  spec.batch = 1024;
  spec.inflight_bytes = uint64_t{1} << 30;
  spec.max_transfers = 128;
  EXPECT_EQ(TransfersInFlight(spec), 4);
}

// A transport that stops answering: the window gives up after its patience, and outcomes the
// scheduler delivers later still find the window (ASan checks they touch no freed memory).
TEST_F(WriteWindowTest, AWindowThatGaveUpSurvivesLateCompletions) {
  RecordingTransport recording(*sender_);
  auto scheduler = SchedulerOn(recording);
  recording.HoldCompletions();
  WindowSpec spec = Spec();
  spec.patience = absl::Milliseconds(100);
  auto result = RunWriteWindow(*scheduler, Target(), spec);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(result.status().message().find("no outcome"), std::string::npos) << result.status();
  EXPECT_GT(recording.ReleaseHeld(), 0u);
}

TEST_F(WriteWindowTest, RefusesSpecsThatCannotRun) {
  auto scheduler = SchedulerOn(*sender_);
  WindowSpec spec = Spec();
  spec.working_set = 100;
  EXPECT_EQ(RunWriteWindow(*scheduler, Target(), spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = Spec();
  spec.block_bytes = 0;
  EXPECT_EQ(RunWriteWindow(*scheduler, Target(), spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  WindowTarget target = Target();
  target.remote = nullptr;
  EXPECT_EQ(RunWriteWindow(*scheduler, target, Spec()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Past the destination arena: the scheduler's bounds check refuses the transfer; nothing lands.
  spec = Spec();
  spec.destination_offset = destination_.size() - 1000;
  auto refused = RunWriteWindow(*scheduler, Target(), spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(destination_[destination_.size() - 1], 0);
}

}  // namespace
}  // namespace kvrail::bench
