#include "engine/transport/loopback/loopback_transport.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/transport/completion_recorder.h"
#include "engine/transport/transport.h"
#include "gtest/gtest.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {
namespace {

std::unique_ptr<LoopbackTransport> MakeTransport(int lanes = 2) {
  return LoopbackTransport::Create({.lanes = lanes}).value();
}

// A sender connected to a receiver; buffers first so that they outlive both.
struct Pair {
  explicit Pair(uint64_t bytes = 4096) : source(bytes), destination(bytes, 0) {
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
    sender = MakeTransport();
    receiver = MakeTransport();
    source_region = sender->Register({source.data(), source.size()}).value();
    destination_region = receiver->Register({destination.data(), destination.size()}).value();
    peer = sender->Connect(receiver->LocalDescriptor().value()).value();
  }

  uint64_t destination_base() const { return reinterpret_cast<uintptr_t>(destination.data()); }

  // One write per `chunk` bytes, covering the buffers.
  std::vector<Write> Chunks(uint64_t chunk) const {
    std::vector<Write> writes;
    for (uint64_t offset = 0; offset < source.size(); offset += chunk) {
      writes.push_back({offset, destination_base() + offset, chunk});
    }
    return writes;
  }

  bool Landed(uint64_t offset, uint64_t length) const {
    return std::memcmp(source.data() + offset, destination.data() + offset, length) == 0;
  }
  bool Untouched(uint64_t offset, uint64_t length) const {
    for (uint64_t i = offset; i < offset + length; ++i) {
      if (destination[i] != 0) return false;
    }
    return true;
  }

  std::vector<uint8_t> source;
  std::vector<uint8_t> destination;
  std::unique_ptr<LoopbackTransport> sender;
  std::unique_ptr<LoopbackTransport> receiver;
  RegionId source_region = 0;
  RegionId destination_region = 0;
  PeerId peer = 0;
};

// Holds the progress thread in a completion until Open(), so that a test can queue work
// behind it deterministically.
class Gate {
 public:
  Completion Hold() {
    return [this](const absl::Status& /*status*/) { opened_.wait(); };
  }
  void Open() {
    if (!std::exchange(opened, true)) open_.set_value();
  }
  // Opens a gate that an early test failure left shut, so that the transport can close.
  ~Gate() { Open(); }

 private:
  bool opened = false;
  std::promise<void> open_;
  std::shared_future<void> opened_ = open_.get_future().share();
};

TEST(LoopbackTransportTest, CreateRejectsNoLanesAndZeroMaxWrite) {
  EXPECT_EQ(LoopbackTransport::Create({.lanes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoopbackTransport::Create({.max_write_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoopbackTransportTest, ReportsItsCapabilities) {
  auto transport =
      LoopbackTransport::Create(
          {.lanes = 3, .max_write_bytes = 4096, .max_inflight_bytes_per_endpoint = 1 << 20})
          .value();
  const Capabilities& caps = transport->capabilities();
  EXPECT_EQ(caps.name, "loopback");
  EXPECT_EQ(caps.lanes, 3);
  EXPECT_TRUE(caps.one_sided);
  EXPECT_FALSE(caps.gpu_memory);
  EXPECT_EQ(caps.max_write_bytes, 4096u);
  EXPECT_EQ(caps.max_inflight_bytes_per_endpoint, 1u << 20);
  EXPECT_EQ(transport->LocalDescriptor().value().transport(), v1::TRANSPORT_KIND_LOOPBACK);
}

TEST(LoopbackTransportTest, RegisterRejectsCudaMemory) {
  auto transport = MakeTransport();
  std::vector<uint8_t> bytes(64);
  EXPECT_EQ(transport->Register({bytes.data(), bytes.size(), /*cuda=*/true}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoopbackTransportTest, FailNextWritesFailsTheBatchWithoutCopying) {
  Pair pair;
  pair.sender->FailNextWrites(1);
  Recorder failed(1);
  ASSERT_TRUE(
      pair.sender
          ->PostWrites(pair.peer, 0, pair.source_region, pair.Chunks(1024), failed.Callback(0))
          .ok());
  ASSERT_TRUE(failed.WaitAll());
  EXPECT_EQ(failed.status(0).code(), absl::StatusCode::kUnavailable) << failed.status(0);
  EXPECT_TRUE(pair.Untouched(0, 4096));
  // The fault is spent: the next batch lands.
  Recorder landed(1);
  ASSERT_TRUE(
      pair.sender
          ->PostWrites(pair.peer, 0, pair.source_region, pair.Chunks(1024), landed.Callback(0))
          .ok());
  ASSERT_TRUE(landed.WaitAll());
  EXPECT_TRUE(landed.status(0).ok());
  EXPECT_TRUE(pair.Landed(0, 4096));
}

TEST(LoopbackTransportTest, FlushReportsAFailedEarlierBatchOnceThenSucceeds) {
  Pair pair;
  pair.sender->FailNextWrites(1);
  Recorder recorder(4);
  const std::vector<Write> writes = pair.Chunks(4096);
  ASSERT_TRUE(
      pair.sender->PostWrites(pair.peer, 1, pair.source_region, writes, recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(1)).ok());  // other lane
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 1, recorder.Callback(2)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 1, recorder.Callback(3)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(recorder.status(1).ok()) << recorder.status(1);
  EXPECT_EQ(recorder.status(2).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(recorder.status(3).ok()) << recorder.status(3);
}

TEST(LoopbackTransportTest, DelayedBatchCompletionsStillPrecedeTheirFlush) {
  Pair pair;
  pair.sender->DelayCompletions(absl::Milliseconds(20));
  std::atomic<int> batches_done{0};
  std::atomic<int> seen_by_flush{-1};
  Recorder recorder(1);
  for (const Write& write : pair.Chunks(1024)) {
    ASSERT_TRUE(pair.sender
                    ->PostWrites(pair.peer, 0, pair.source_region, {&write, 1},
                                 [&](const absl::Status& status) {
                                   EXPECT_TRUE(status.ok()) << status;
                                   ++batches_done;
                                 })
                    .ok());
  }
  Completion flush_done = recorder.Callback(0);
  ASSERT_TRUE(pair.sender
                  ->Flush(pair.peer, 0,
                          [&](absl::Status status) {
                            seen_by_flush = batches_done.load();
                            flush_done(std::move(status));
                          })
                  .ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok());
  EXPECT_EQ(seen_by_flush.load(), 4);
  EXPECT_TRUE(pair.Landed(0, 4096));
}

TEST(LoopbackTransportTest, CloseCancelsDelayedCompletionsAndReturnsPromptly) {
  Pair pair;
  pair.sender->DelayCompletions(absl::Hours(1));
  Recorder recorder(4);
  for (int op = 0; op < 3; ++op) {
    ASSERT_TRUE(pair.sender
                    ->PostWrites(pair.peer, op % 2, pair.source_region, pair.Chunks(1024),
                                 recorder.Callback(op))
                    .ok());
  }
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(3)).ok());
  const absl::Time start = absl::Now();
  pair.sender->Close();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (int op = 0; op < 4; ++op) {
    EXPECT_EQ(recorder.calls(op), 1) << op;
    EXPECT_EQ(recorder.status(op).code(), absl::StatusCode::kCancelled) << recorder.status(op);
  }
}

TEST(LoopbackTransportTest, DisconnectCancelsOnlyThatPeersOutstandingWork) {
  Pair pair;
  const PeerId other = pair.sender->Connect(pair.receiver->LocalDescriptor().value()).value();
  Gate gate;
  Recorder recorder(4);
  const std::vector<Write> writes = pair.Chunks(4096);
  ASSERT_TRUE(pair.sender->Flush(other, 0, gate.Hold()).ok());
  ASSERT_TRUE(
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(1)).ok());
  ASSERT_TRUE(
      pair.sender->PostWrites(other, 0, pair.source_region, writes, recorder.Callback(2)).ok());
  ASSERT_TRUE(pair.sender->Flush(other, 0, recorder.Callback(3)).ok());
  ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
  gate.Open();
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kCancelled) << recorder.status(0);
  EXPECT_EQ(recorder.status(1).code(), absl::StatusCode::kCancelled) << recorder.status(1);
  EXPECT_TRUE(recorder.status(2).ok()) << recorder.status(2);
  EXPECT_TRUE(recorder.status(3).ok()) << recorder.status(3);
}

TEST(LoopbackTransportTest, DisconnectCutsADelayedCompletionShort) {
  Pair pair;
  pair.sender->DelayCompletions(absl::Hours(1));
  Recorder recorder(1);
  ASSERT_TRUE(
      pair.sender
          ->PostWrites(pair.peer, 0, pair.source_region, pair.Chunks(4096), recorder.Callback(0))
          .ok());
  ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kCancelled) << recorder.status(0);
}

TEST(LoopbackTransportTest, PeerKilledMidBatchFailsTheRestUnavailable) {
  Pair pair;
  pair.sender->KillPeerAfterWrites(pair.receiver.get(), 3);
  Recorder recorder(2);
  ASSERT_TRUE(
      pair.sender
          ->PostWrites(pair.peer, 0, pair.source_region, pair.Chunks(512), recorder.Callback(0))
          .ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(1)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kUnavailable) << recorder.status(0);
  EXPECT_EQ(recorder.status(1).code(), absl::StatusCode::kUnavailable) << recorder.status(1);
  EXPECT_TRUE(pair.Landed(0, uint64_t{3} * 512));
  EXPECT_TRUE(pair.Untouched(uint64_t{3} * 512, 4096 - uint64_t{3} * 512));
  EXPECT_EQ(pair.receiver->LocalDescriptor().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LoopbackTransportTest, ConnectToClosedTransportIsUnavailable) {
  Pair pair;
  const v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  pair.receiver->Close();
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kUnavailable);
}

TEST(LoopbackTransportTest, ConnectRejectsRegionThatDoesNotMatchItsKey) {
  Pair pair;
  v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  descriptor.mutable_regions(0)->set_length(descriptor.regions(0).length() + 4096);
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoopbackTransportTest, ConnectRejectsForeignRemoteKey) {
  Pair pair;
  v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  descriptor.mutable_regions(0)->set_remote_key("\x01\x02");
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoopbackTransportTest, StaleDescriptorConnectsButItsWritesAreUnavailable) {
  Pair pair;
  const v1::HandshakeDescriptor stale = pair.receiver->LocalDescriptor().value();
  ASSERT_TRUE(pair.receiver->Deregister(pair.destination_region).ok());
  const PeerId peer = pair.sender->Connect(stale).value();
  Recorder recorder(1);
  ASSERT_TRUE(
      pair.sender->PostWrites(peer, 0, pair.source_region, pair.Chunks(4096), recorder.Callback(0))
          .ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(pair.Untouched(0, 4096));
}

TEST(LoopbackTransportTest, SourceDeregisteredBeforeAQueuedBatchRunsCancelsIt) {
  Pair pair;
  Gate gate;
  Recorder recorder(2);
  const std::vector<Write> first = {{0, pair.destination_base(), 2048}};
  const std::vector<Write> second = {{2048, pair.destination_base() + 2048, 2048}};
  Completion first_done = recorder.Callback(0);
  ASSERT_TRUE(pair.sender->PostWrites(pair.peer, 0, pair.source_region, first, gate.Hold()).ok());
  // Runs on the progress thread after the first batch and before the second.
  ASSERT_TRUE(pair.sender
                  ->Flush(pair.peer, 0,
                          [&](absl::Status status) {
                            EXPECT_TRUE(pair.sender->Deregister(pair.source_region).ok());
                            first_done(std::move(status));
                          })
                  .ok());
  ASSERT_TRUE(
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, second, recorder.Callback(1)).ok());
  gate.Open();
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok());
  EXPECT_EQ(recorder.status(1).code(), absl::StatusCode::kCancelled) << recorder.status(1);
  EXPECT_TRUE(pair.Landed(0, 2048));
  EXPECT_TRUE(pair.Untouched(2048, 2048));
}

TEST(LoopbackTransportTest, CloseFromACompletionCancelsTheRestWithoutDeadlock) {
  Pair pair;
  Gate gate;
  Recorder recorder(3);
  Completion first_done = recorder.Callback(0);
  const std::vector<Write> writes = pair.Chunks(4096);
  ASSERT_TRUE(pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, gate.Hold()).ok());
  ASSERT_TRUE(pair.sender
                  ->Flush(pair.peer, 0,
                          [&](absl::Status status) {
                            pair.sender->Close();
                            first_done(std::move(status));
                          })
                  .ok());
  ASSERT_TRUE(
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, recorder.Callback(1)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(2)).ok());
  gate.Open();
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok());
  EXPECT_EQ(recorder.status(1).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(recorder.status(2).code(), absl::StatusCode::kCancelled);
  pair.sender.reset();  // joins the progress thread
}

TEST(LoopbackTransportTest, DestroyingWithOutstandingWorkCompletesItAndLeaksNothing) {
  Recorder recorder(8);
  {
    Pair pair(1 << 20);
    pair.sender->DelayCompletions(absl::Milliseconds(5));
    for (int op = 0; op < 8; ++op) {
      ASSERT_TRUE(pair.sender
                      ->PostWrites(pair.peer, op % 2, pair.source_region, pair.Chunks(64 << 10),
                                   recorder.Callback(op))
                      .ok());
    }
  }
  for (int op = 0; op < 8; ++op) EXPECT_EQ(recorder.calls(op), 1) << op;
}

TEST(LoopbackTransportTest, WritesIntoItsOwnRegionsWork) {
  auto transport = MakeTransport();
  std::vector<uint8_t> bytes(8192, 0);
  for (size_t i = 0; i < 4096; ++i) bytes[i] = static_cast<uint8_t>(i);
  const RegionId region = transport->Register({bytes.data(), bytes.size()}).value();
  const PeerId self = transport->Connect(transport->LocalDescriptor().value()).value();
  Recorder recorder(1);
  const std::vector<Write> writes = {{0, reinterpret_cast<uintptr_t>(bytes.data()) + 4096, 4096}};
  ASSERT_TRUE(transport->PostWrites(self, 0, region, writes, recorder.Callback(0)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok());
  EXPECT_EQ(std::memcmp(bytes.data(), bytes.data() + 4096, 4096), 0);
}

}  // namespace
}  // namespace kvrail::transport
