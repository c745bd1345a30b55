#include "engine/transport/fault/fault_transport.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/transport/completion_recorder.h"
#include "engine/transport/loopback/loopback_transport.h"
#include "engine/transport/transport.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

using Op = FaultTransport::Op;
using FailMode = FaultTransport::FailMode;

// A sender (the wrapper over loopback) connected to a plain loopback receiver; buffers first
// so that they outlive both.
struct Pair {
  explicit Pair(uint64_t bytes = 4096) : source(bytes), destination(bytes, 0) {
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 1);
    sender = std::make_unique<FaultTransport>(LoopbackTransport::Create({.lanes = 2}).value());
    receiver = LoopbackTransport::Create({.lanes = 2}).value();
    source_region = sender->Register({source.data(), source.size()}).value();
    destination_region = receiver->Register({destination.data(), destination.size()}).value();
    peer = Connect();
  }

  PeerId Connect() { return sender->Connect(receiver->LocalDescriptor().value()).value(); }

  uint64_t destination_base() const { return reinterpret_cast<uintptr_t>(destination.data()); }

  // One write of `length` bytes from `offset` in the source to `offset` in the destination.
  std::vector<Write> Span(uint64_t offset, uint64_t length) const {
    return {{offset, destination_base() + offset, length}};
  }

  absl::Status Post(int lane, const std::vector<Write>& writes, Completion done, PeerId to = 0) {
    return sender->PostWrites(to == 0 ? peer : to, lane, source_region, writes, std::move(done));
  }

  bool Landed(uint64_t offset, uint64_t length) const {
    return std::memcmp(source.data() + offset, destination.data() + offset, length) == 0;
  }
  bool Untouched(uint64_t offset, uint64_t length) const {
    const auto begin = destination.begin() + static_cast<ptrdiff_t>(offset);
    return std::all_of(begin, begin + static_cast<ptrdiff_t>(length),
                       [](uint8_t b) { return b == 0; });
  }

  // Stops `lane` and makes two calls that it holds: a batch writing the whole destination
  // (`recorder`'s operation 0) and a flush (operation 1).
  void HoldBatchAndFlush(int lane, Recorder& recorder) {
    ASSERT_TRUE(sender->StopLane(lane).ok());
    ASSERT_TRUE(Post(lane, Span(0, source.size()), recorder.Callback(0)).ok());
    ASSERT_TRUE(sender->Flush(peer, lane, recorder.Callback(1)).ok());
  }

  // Flushes `lane` as `recorder`'s operation 0; `landed` says whether every byte of the
  // destination had landed when the flush's completion ran.
  absl::Status FlushNotingLanded(int lane, Recorder& recorder, bool& landed) {
    Completion done = recorder.Callback(0);
    return sender->Flush(peer, lane, [this, &landed, done](absl::Status status) {
      landed = Landed(0, source.size());
      done(std::move(status));
    });
  }

  std::vector<uint8_t> source;
  std::vector<uint8_t> destination;
  std::unique_ptr<FaultTransport> sender;
  std::unique_ptr<LoopbackTransport> receiver;
  RegionId source_region = 0;
  RegionId destination_region = 0;
  PeerId peer = 0;
};

// Flushes `lane` of the pair's peer and waits; the flush's status.
absl::Status FlushAndWait(Pair& pair, int lane, PeerId to = 0) {
  Recorder flush(1);
  absl::Status posted = pair.sender->Flush(to == 0 ? pair.peer : to, lane, flush.Callback(0));
  if (!posted.ok()) return posted;
  if (!flush.WaitAll()) return absl::DeadlineExceededError("flush never completed");
  return flush.status(0);
}

void Ignore(const absl::Status& /*status*/) {}

TEST(FaultTransportTest, KeepsTheInnerCapabilitiesUnderItsOwnName) {
  FaultTransport transport(
      LoopbackTransport::Create({.lanes = 3, .max_write_bytes = 4096}).value());
  EXPECT_EQ(transport.capabilities().name, "fault(loopback)");
  EXPECT_EQ(transport.capabilities().lanes, 3);
  EXPECT_EQ(transport.capabilities().max_write_bytes, 4096u);
  EXPECT_EQ(transport.LocalDescriptor().value().transport(), v1::TRANSPORT_KIND_LOOPBACK);
}

TEST(FaultTransportTest, WithoutFaultsEveryCallIsForwarded) {
  Pair pair;
  Recorder recorder(2);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 2048), recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.Post(1, pair.Span(2048, 2048), recorder.Callback(1)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(FlushAndWait(pair, 0).ok());
  EXPECT_TRUE(FlushAndWait(pair, 1).ok());
  EXPECT_TRUE(pair.Landed(0, 4096));
  const FaultCounters counters = pair.sender->counters();
  EXPECT_EQ(counters.forwarded, 4u);
  EXPECT_EQ(counters.injected, 0u);
  EXPECT_EQ(counters.held, std::vector<int>({0, 0}));
}

TEST(FaultTransportTest, StoppedLaneAcceptsWritesAndFlushesButForwardsNothing) {
  Pair pair;
  Recorder recorder(2);
  pair.HoldBatchAndFlush(0, recorder);
  const FaultCounters counters = pair.sender->counters();
  EXPECT_EQ(counters.held, std::vector<int>({2, 0}));
  EXPECT_EQ(counters.forwarded, 0u);
  // Nothing reached the inner transport, so nothing can complete or land.
  EXPECT_EQ(recorder.calls(0), 0);
  EXPECT_EQ(recorder.calls(1), 0);
  EXPECT_TRUE(pair.Untouched(0, 4096));
  ASSERT_TRUE(pair.sender->ResumeLane(0).ok());
  ASSERT_TRUE(recorder.WaitAll());
}

TEST(FaultTransportTest, ResumedLaneForwardsHeldCallsInTheOrderTheyWereMade) {
  Pair pair;
  ASSERT_TRUE(pair.sender->StopLane(1).ok());
  Recorder recorder(3);
  // The second write overwrites the first one's destination: only the order makes it win.
  const std::vector<Write> first = {{0, pair.destination_base(), 2048}};
  const std::vector<Write> second = {{2048, pair.destination_base(), 2048}};
  ASSERT_TRUE(pair.Post(1, first, recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.Post(1, second, recorder.Callback(1)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 1, recorder.Callback(2)).ok());
  ASSERT_TRUE(pair.sender->ResumeLane(1).ok());
  EXPECT_EQ(pair.sender->counters().held, std::vector<int>({0, 0}));
  EXPECT_EQ(pair.sender->counters().forwarded, 3u);
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.order(), std::vector<int>({0, 1, 2}));
  for (int op = 0; op < 3; ++op) EXPECT_TRUE(recorder.status(op).ok()) << recorder.status(op);
  EXPECT_EQ(std::memcmp(pair.destination.data(), pair.source.data() + 2048, 2048), 0);
}

TEST(FaultTransportTest, FlushOfAStoppedLaneReportsOnlyAfterItsHeldWritesLanded) {
  Pair pair;
  ASSERT_TRUE(pair.sender->StopLane(0).ok());
  for (uint64_t offset = 0; offset < 4096; offset += 1024) {
    ASSERT_TRUE(pair.Post(0, pair.Span(offset, 1024), Ignore).ok());
  }
  bool landed_when_flushed = false;
  Recorder recorder(1);
  ASSERT_TRUE(pair.FlushNotingLanded(0, recorder, landed_when_flushed).ok());
  EXPECT_EQ(recorder.calls(0), 0);
  ASSERT_TRUE(pair.sender->ResumeLane(0).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok()) << recorder.status(0);
  EXPECT_TRUE(landed_when_flushed);
}

TEST(FaultTransportTest, StoppedLaneLeavesTheOtherLanesFlowing) {
  Pair pair;
  ASSERT_TRUE(pair.sender->StopLane(0).ok());
  Recorder recorder(1);
  ASSERT_TRUE(pair.Post(1, pair.Span(0, 4096), recorder.Callback(0)).ok());
  EXPECT_TRUE(FlushAndWait(pair, 1).ok());
  EXPECT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(pair.Landed(0, 4096));
}

TEST(FaultTransportTest, PostsRacingALaneThatStopsAndResumesAllLandAndCompleteOnce) {
  constexpr int kThreads = 3;
  constexpr int kBatchesPerThread = 64;
  constexpr uint64_t kChunk = 512;
  Pair pair(kThreads * kBatchesPerThread * kChunk);
  Recorder recorder(kThreads * kBatchesPerThread);
  std::atomic<bool> posting{true};
  std::thread toggler([&] {
    while (posting.load()) {
      EXPECT_TRUE(pair.sender->StopLane(0).ok());
      std::this_thread::yield();
      EXPECT_TRUE(pair.sender->ResumeLane(0).ok());
    }
  });
  std::vector<std::thread> posters;
  for (int t = 0; t < kThreads; ++t) {
    posters.emplace_back([&, t] {
      for (int b = 0; b < kBatchesPerThread; ++b) {
        const int op = t * kBatchesPerThread + b;
        EXPECT_TRUE(pair.Post(0, pair.Span(op * kChunk, kChunk), recorder.Callback(op)).ok());
      }
    });
  }
  for (std::thread& poster : posters) poster.join();
  posting.store(false);
  toggler.join();
  ASSERT_TRUE(pair.sender->ResumeLane(0).ok());
  ASSERT_TRUE(recorder.WaitAll());
  for (int op = 0; op < kThreads * kBatchesPerThread; ++op) {
    EXPECT_EQ(recorder.calls(op), 1) << op;
    EXPECT_TRUE(recorder.status(op).ok()) << op << ": " << recorder.status(op);
  }
  EXPECT_TRUE(FlushAndWait(pair, 0).ok());
  EXPECT_TRUE(pair.Landed(0, pair.source.size()));
  EXPECT_EQ(pair.sender->counters().held, std::vector<int>({0, 0}));
}

TEST(FaultTransportTest, HeldCallIsCheckedAsTheInnerTransportWouldCheckIt) {
  Pair pair;
  ASSERT_TRUE(pair.sender->StopLane(0).ok());
  const std::vector<Write> past_end = {{0, pair.destination_base() + 1, 4096}};
  EXPECT_EQ(pair.Post(0, past_end, Ignore).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pair.Post(0, pair.Span(0, 16), Ignore, /*to=*/pair.peer + 100).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      pair.sender->PostWrites(pair.peer, 0, pair.source_region + 100, pair.Span(0, 16), Ignore)
          .code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(pair.sender->Flush(pair.peer, 2, Ignore).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pair.sender->counters().held, std::vector<int>({0, 0}));
}

TEST(FaultTransportTest, DisconnectCancelsHeldCallsFromTheWrappersThreadAndTheyNeverLand) {
  Pair pair;
  Recorder recorder(2);
  pair.HoldBatchAndFlush(0, recorder);
  ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
  ASSERT_TRUE(recorder.WaitAll());
  for (int op = 0; op < 2; ++op) {
    EXPECT_EQ(recorder.status(op).code(), absl::StatusCode::kCancelled) << recorder.status(op);
  }
  for (std::thread::id id : recorder.threads()) EXPECT_NE(id, std::this_thread::get_id());
  ASSERT_TRUE(pair.sender->ResumeLane(0).ok());  // nothing left to forward
  const FaultCounters counters = pair.sender->counters();
  EXPECT_EQ(counters.dropped, 2u);
  EXPECT_EQ(counters.forwarded, 0u);
  EXPECT_EQ(counters.held, std::vector<int>({0, 0}));
  // The receiver's queue runs in order: a flush through another peer passes every write the
  // inner transport was given.
  const PeerId other = pair.Connect();
  EXPECT_TRUE(FlushAndWait(pair, 0, other).ok());
  EXPECT_TRUE(pair.Untouched(0, 4096));
}

TEST(FaultTransportTest, DisconnectDropsOnlyThatPeersHeldCalls) {
  Pair pair;
  const PeerId other = pair.Connect();
  ASSERT_TRUE(pair.sender->StopLane(0).ok());
  Recorder recorder(2);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 2048), recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.Post(0, pair.Span(2048, 2048), recorder.Callback(1), other).ok());
  ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
  ASSERT_TRUE(pair.sender->ResumeLane(0).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(recorder.status(1).ok()) << recorder.status(1);
  EXPECT_TRUE(FlushAndWait(pair, 0, other).ok());
  EXPECT_TRUE(pair.Untouched(0, 2048));
  EXPECT_TRUE(pair.Landed(2048, 2048));
}

TEST(FaultTransportTest, CloseCancelsHeldCallsBeforeItReturnsAndTheyNeverLand) {
  Pair pair;
  Recorder recorder(2);
  pair.HoldBatchAndFlush(1, recorder);
  pair.sender->Close();
  for (int op = 0; op < 2; ++op) {
    EXPECT_EQ(recorder.calls(op), 1) << op;
    EXPECT_EQ(recorder.status(op).code(), absl::StatusCode::kCancelled) << recorder.status(op);
  }
  EXPECT_TRUE(pair.sender->ResumeLane(1).ok());
  EXPECT_EQ(pair.sender->counters().forwarded, 0u);
  EXPECT_TRUE(pair.Untouched(0, 4096));
}

TEST(FaultTransportTest, HeldPostWhoseSourceWasDeregisteredIsCancelledOnResume) {
  Pair pair;
  ASSERT_TRUE(pair.sender->StopLane(0).ok());
  Recorder recorder(1);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 4096), recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.sender->Deregister(pair.source_region).ok());
  ASSERT_TRUE(pair.sender->ResumeLane(0).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kCancelled) << recorder.status(0);
  EXPECT_TRUE(FlushAndWait(pair, 0).ok());
  EXPECT_TRUE(pair.Untouched(0, 4096));
}

TEST(FaultTransportTest, DestroyingWithHeldCallsCompletesEachOnce) {
  Recorder recorder(2);
  {
    Pair pair;
    pair.HoldBatchAndFlush(0, recorder);
  }
  EXPECT_EQ(recorder.calls(0), 1);
  EXPECT_EQ(recorder.calls(1), 1);
}

TEST(FaultTransportTest, DelayedCompletionComesFromTheWrappersThread) {
  Pair pair;
  Recorder undelayed(1);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 2048), undelayed.Callback(0)).ok());
  ASSERT_TRUE(undelayed.WaitAll());
  ASSERT_TRUE(pair.sender->DelayCompletions(0, absl::Milliseconds(1)).ok());
  Recorder delayed(1);
  ASSERT_TRUE(pair.Post(0, pair.Span(2048, 2048), delayed.Callback(0)).ok());
  ASSERT_TRUE(delayed.WaitAll());
  EXPECT_TRUE(delayed.status(0).ok()) << delayed.status(0);
  // The inner transport's progress thread delivered the first; the wrapper's the second.
  EXPECT_NE(delayed.threads()[0], undelayed.threads()[0]);
  EXPECT_NE(delayed.threads()[0], std::this_thread::get_id());
}

TEST(FaultTransportTest, DelayedCompletionsKeepTheirOrderWithTheFlushLast) {
  constexpr int kBatches = 8;
  Pair pair;
  ASSERT_TRUE(pair.sender->DelayCompletions(1, absl::Milliseconds(2)).ok());
  Recorder recorder(kBatches + 1);
  for (int b = 0; b < kBatches; ++b) {
    ASSERT_TRUE(pair.Post(1, pair.Span(b * 512, 512), recorder.Callback(b)).ok());
  }
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 1, recorder.Callback(kBatches)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  std::vector<int> expected;
  for (int op = 0; op <= kBatches; ++op) expected.push_back(op);
  EXPECT_EQ(recorder.order(), expected);
  EXPECT_TRUE(recorder.status(kBatches).ok());
  EXPECT_TRUE(pair.Landed(0, 4096));
}

TEST(FaultTransportTest, DisconnectCutsADelayedCompletionShortAsCancelled) {
  Pair pair;
  ASSERT_TRUE(pair.sender->DelayCompletions(0, absl::Hours(1)).ok());
  Recorder recorder(1);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 4096), recorder.Callback(0)).ok());
  EXPECT_TRUE(FlushAndWait(pair, 1).ok());  // loopback's one queue: the batch ran before it
  EXPECT_EQ(recorder.calls(0), 0);
  ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kCancelled) << recorder.status(0);
}

TEST(FaultTransportTest, CloseDeliversDelayedCompletionsBeforeItReturns) {
  Pair pair;
  ASSERT_TRUE(pair.sender->DelayCompletions(0, absl::Hours(1)).ok());
  Recorder recorder(2);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 4096), recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(1)).ok());
  // Loopback runs one queue in posting order: once lane 1's flush is back, lane 0's batch and
  // flush have completed in the inner transport and wait in the wrapper.
  EXPECT_TRUE(FlushAndWait(pair, 1).ok());
  EXPECT_EQ(recorder.calls(0), 0);
  pair.sender->Close();
  for (int op = 0; op < 2; ++op) {
    EXPECT_EQ(recorder.calls(op), 1) << op;
    EXPECT_EQ(recorder.status(op).code(), absl::StatusCode::kCancelled) << recorder.status(op);
  }
}

TEST(FaultTransportTest, CloseFromADelayedCompletionCancelsTheRestWithoutDeadlock) {
  Pair pair;
  ASSERT_TRUE(pair.sender->DelayCompletions(0, absl::Milliseconds(1)).ok());
  Recorder recorder(2);
  Completion first_done = recorder.Callback(0);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 2048),
                        [&](absl::Status status) {
                          pair.sender->Close();
                          first_done(std::move(status));
                        })
                  .ok());
  ASSERT_TRUE(pair.sender->StopLane(1).ok());
  ASSERT_TRUE(pair.Post(1, pair.Span(2048, 2048), recorder.Callback(1)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok()) << recorder.status(0);
  EXPECT_EQ(recorder.status(1).code(), absl::StatusCode::kCancelled) << recorder.status(1);
  pair.sender.reset();  // joins the delivery thread
}

TEST(FaultTransportTest, PostFailedOnReturnPostsNothingAndNeverCompletes) {
  Pair pair;
  ASSERT_TRUE(
      pair.sender
          ->FailNext(Op::kPostWrites, 2, absl::UnavailableError("injected"), FailMode::kReturned)
          .ok());
  Recorder recorder(3);
  EXPECT_EQ(pair.Post(0, pair.Span(0, 1024), recorder.Callback(0)).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(pair.Post(0, pair.Span(1024, 1024), recorder.Callback(1)).code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(pair.Post(0, pair.Span(2048, 1024), recorder.Callback(2)).ok());  // spent
  EXPECT_TRUE(FlushAndWait(pair, 0).ok());
  EXPECT_EQ(recorder.calls(0), 0);
  EXPECT_EQ(recorder.calls(1), 0);
  EXPECT_EQ(recorder.calls(2), 1);
  EXPECT_TRUE(pair.Untouched(0, 2048));
  EXPECT_TRUE(pair.Landed(2048, 1024));
  EXPECT_EQ(pair.sender->counters().injected, 2u);
}

TEST(FaultTransportTest, PostFailedInItsCompletionWritesNothingAndTheNextFlushReportsIt) {
  Pair pair;
  ASSERT_TRUE(
      pair.sender
          ->FailNext(Op::kPostWrites, 1, absl::UnavailableError("injected"), FailMode::kCompleted)
          .ok());
  Recorder recorder(1);
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 4096), recorder.Callback(0)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(recorder.threads()[0], std::this_thread::get_id());
  EXPECT_TRUE(FlushAndWait(pair, 1).ok());  // another lane knows nothing of it
  EXPECT_EQ(FlushAndWait(pair, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(FlushAndWait(pair, 0).ok());  // reported once
  EXPECT_TRUE(pair.Untouched(0, 4096));
}

TEST(FaultTransportTest, FlushFailedOnReturnNeverCompletes) {
  Pair pair;
  ASSERT_TRUE(
      pair.sender->FailNext(Op::kFlush, 1, absl::UnavailableError("injected"), FailMode::kReturned)
          .ok());
  Recorder recorder(1);
  EXPECT_EQ(pair.sender->Flush(pair.peer, 0, recorder.Callback(0)).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(FlushAndWait(pair, 0).ok());
  EXPECT_EQ(recorder.calls(0), 0);
}

TEST(FaultTransportTest, FlushFailedInItsCompletionReportsOnlyAfterEarlierWritesEnded) {
  Pair pair;
  ASSERT_TRUE(
      pair.sender->FailNext(Op::kFlush, 1, absl::DataLossError("injected"), FailMode::kCompleted)
          .ok());
  ASSERT_TRUE(pair.Post(0, pair.Span(0, 4096), Ignore).ok());
  bool landed_when_failed = false;
  Recorder recorder(1);
  ASSERT_TRUE(pair.FlushNotingLanded(0, recorder, landed_when_failed).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kDataLoss);
  // The inner flush ran first: the writes before it had ended (here, landed) when it failed.
  EXPECT_TRUE(landed_when_failed);
}

TEST(FaultTransportTest, ConnectFailsAsManyTimesAsAsked) {
  Pair pair;
  ASSERT_TRUE(pair.sender->FailNext(Op::kConnect, 2, absl::UnavailableError("injected")).ok());
  const v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(pair.sender->Connect(descriptor).ok());
  EXPECT_EQ(pair.sender->counters().injected, 2u);
}

TEST(FaultTransportTest, FailNextRejectsAnOkStatusANegativeCountAndACompletedConnect) {
  Pair pair;
  EXPECT_EQ(pair.sender->FailNext(Op::kFlush, 1, absl::OkStatus()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pair.sender->FailNext(Op::kFlush, -1, absl::UnknownError("x")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      pair.sender->FailNext(Op::kConnect, 1, absl::UnknownError("x"), FailMode::kCompleted).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(FaultTransportTest, FaultControlsRejectALaneOutsideTheTransport) {
  Pair pair;
  for (int lane : {-1, 2}) {
    EXPECT_EQ(pair.sender->StopLane(lane).code(), absl::StatusCode::kInvalidArgument) << lane;
    EXPECT_EQ(pair.sender->ResumeLane(lane).code(), absl::StatusCode::kInvalidArgument) << lane;
    EXPECT_EQ(pair.sender->DelayCompletions(lane, absl::Milliseconds(1)).code(),
              absl::StatusCode::kInvalidArgument)
        << lane;
  }
}

}  // namespace
}  // namespace kvrail::transport
