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

// Forwards to a real transport and records what the window asked of it, with the bytes each
// lane had posted and not yet seen landed (covered by a completed Flush) at every post.
class RecordingTransport final : public Transport {
 public:
  explicit RecordingTransport(Transport& inner) : inner_(inner) {}

  struct Event {
    bool flush = false;
    int lane = 0;
    uint64_t bytes = 0;
    int posts_outstanding = 0;  // on this lane, before it
    uint64_t unlanded = 0;      // posts: this lane's bytes not known landed, before this one
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
      uint64_t unlanded = 0;
      for (size_t i = log.landed; i < log.posts.size(); ++i) unlanded += log.posts[i];
      events_.push_back({false, lane, bytes, log.outstanding, unlanded});
      log.posts.push_back(bytes);
      ++log.outstanding;
    }
    return inner_.PostWrites(peer, lane, source, writes,
                             [this, lane, done = std::move(done)](absl::Status s) mutable {
                               {
                                 std::lock_guard<std::mutex> lock(mu_);
                                 --lanes_[lane].outstanding;
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
      events_.push_back({true, lane, 0, lanes_[lane].outstanding, 0});
      covers = lanes_[lane].posts.size();
    }
    return inner_.Flush(peer, lane, [this, lane, covers, done = std::move(done)](absl::Status s) {
      {
        std::lock_guard<std::mutex> lock(mu_);
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

  std::vector<Event> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  struct LaneLog {
    std::vector<uint64_t> posts;  // bytes of every post, in order
    size_t landed = 0;            // posts [0, landed) are covered by a completed flush
    int outstanding = 0;
  };
  Transport& inner_;
  std::mutex mu_;
  std::map<int, LaneLog> lanes_;
  std::vector<Event> events_;
  bool hold_ = false;
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
    peer_ = sender_->Connect(receiver_->LocalDescriptor().value()).value();
  }

  uint64_t DestinationAddress() const { return reinterpret_cast<uintptr_t>(destination_.data()); }

  WindowSpec Spec() const {
    WindowSpec spec;
    spec.block_bytes = 10000;  // not a multiple of the slice
    spec.batch = 5;
    spec.working_set = uint64_t{5} * 10000;
    spec.destination_address = DestinationAddress();
    spec.lanes = 3;
    spec.slice_bytes = 4096;
    spec.inflight_bytes_per_lane = 8192;
    spec.post_bytes = 8192;
    spec.posts_per_lane = 2;
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
};

TEST_F(WriteWindowTest, EveryByteOfABatchLandsAtItsOffset) {
  WindowSpec spec = Spec();
  spec.source_offset = 123;
  auto result = RunWriteWindow(*sender_, peer_, source_region_, spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, 50000u);
  EXPECT_EQ(result->writes, 5u * 3);  // 4096 + 4096 + 1808 per block
  EXPECT_FALSE(FirstPatternMismatch(absl::MakeConstSpan(destination_.data(), 50000), kSeed, 123)
                   .has_value());
  EXPECT_EQ(destination_[50000], 0);  // nothing past the working set
}

TEST_F(WriteWindowTest, WindowEndsWithAFlushOfEveryLaneAfterThePostsCompleted) {
  RecordingTransport recorder(*sender_);
  auto result = RunWriteWindow(recorder, peer_, source_region_, Spec());
  ASSERT_TRUE(result.ok()) << result.status();
  const auto events = recorder.events();
  ASSERT_GE(events.size(), 3u);
  // Lanes post independently, from their own threads, so lanes interleave; each lane's last
  // call is its final flush, made when none of its posts was outstanding.
  std::map<int, size_t> last;
  for (size_t i = 0; i < events.size(); ++i) last[events[i].lane] = i;
  ASSERT_EQ(last.size(), 3u);
  for (const auto& [lane, index] : last) {
    EXPECT_TRUE(events[index].flush) << "lane " << lane;
    EXPECT_EQ(events[index].posts_outstanding, 0) << "lane " << lane;
  }
  EXPECT_EQ(result->flushes,
            static_cast<uint64_t>(std::count_if(events.begin(), events.end(),
                                                [](const auto& e) { return e.flush; })));
}

TEST_F(WriteWindowTest, BytesNotKnownLandedStayWithinTheBoundPerLane) {
  RecordingTransport recorder(*sender_);
  sender_->DelayCompletions(absl::Milliseconds(2));  // let posts pile up against the bounds
  WindowSpec spec = Spec();
  spec.max_bytes = 0;
  spec.duration = absl::Milliseconds(100);
  spec.post_bytes = 4096;
  spec.posts_per_lane = 4;
  auto result = RunWriteWindow(recorder, peer_, source_region_, spec);
  ASSERT_TRUE(result.ok()) << result.status();
  std::map<int, int> posts_per_lane;
  int flushes = 0;
  for (const auto& e : recorder.events()) {
    if (e.flush) {
      ++flushes;
      continue;
    }
    ++posts_per_lane[e.lane];
    EXPECT_LT(e.posts_outstanding, spec.posts_per_lane);
    EXPECT_LE(e.bytes, spec.post_bytes);
    if (e.unlanded > 0) EXPECT_LE(e.unlanded + e.bytes, spec.inflight_bytes_per_lane);
  }
  EXPECT_EQ(posts_per_lane.size(), 3u);  // striped over every lane
  EXPECT_GT(flushes, 3);                 // lanes flushed along the way, not only at the end
  EXPECT_GT(result->bytes, 0u);
}

TEST_F(WriteWindowTest, ADurationWindowRunsAboutThatLongAndCountsWholePosts) {
  WindowSpec spec = Spec();
  spec.max_bytes = 0;
  spec.duration = absl::Milliseconds(50);
  auto result = RunWriteWindow(*sender_, peer_, source_region_, spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GE(result->elapsed, absl::Milliseconds(50));
  EXPECT_GT(result->bytes, 50000u);
  EXPECT_GT(result->gbps(), 0);
  EXPECT_GT(result->blocks_per_s(spec.block_bytes), 0);
  // The destination holds the source pattern throughout the working set.
  EXPECT_FALSE(
      FirstPatternMismatch(absl::MakeConstSpan(destination_.data(), 50000), kSeed, 0).has_value());
}

TEST_F(WriteWindowTest, AFailedWriteEndsTheWindowWithItsStatus) {
  sender_->FailNextWrites(1);
  auto result = RunWriteWindow(*sender_, peer_, source_region_, Spec());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
}

// A transport that stops answering: the window gives up after its patience, and completions the
// transport delivers later still find the window (ASan checks they touch no freed memory).
TEST_F(WriteWindowTest, AWindowThatGaveUpSurvivesLateCompletions) {
  RecordingTransport recording(*sender_);
  recording.HoldCompletions();
  WindowSpec spec = Spec();
  spec.patience = absl::Milliseconds(100);
  auto result = RunWriteWindow(recording, peer_, source_region_, spec);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(result.status().message().find("did not complete"), std::string::npos)
      << result.status();
  EXPECT_GT(recording.ReleaseHeld(), 0u);
}

TEST_F(WriteWindowTest, RejectsSpecsThatCannotRun) {
  WindowSpec spec = Spec();
  spec.lanes = 5;  // the transport has 4
  EXPECT_EQ(RunWriteWindow(*sender_, peer_, source_region_, spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = Spec();
  spec.working_set = 100;
  EXPECT_EQ(RunWriteWindow(*sender_, peer_, source_region_, spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec = Spec();
  spec.block_bytes = 0;
  EXPECT_EQ(RunWriteWindow(*sender_, peer_, source_region_, spec).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvrail::bench
