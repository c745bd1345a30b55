// The scheduler's fence against faults the kernel cannot make here, from the fault-injecting
// wrapper over the loopback backend (engine/transport/fault): a lane that stops (its writes
// held, to land later) and writes that fail.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "engine/memory/pattern.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/fault/fault_transport.h"
#include "engine/transport/loopback/loopback_transport.h"

namespace kvrail::transfer {
namespace {

using transport::FaultTransport;
using transport::LoopbackOptions;
using transport::LoopbackTransport;

constexpr uint64_t kMiB = 1 << 20;

class Outcomes {
 public:
  TransferDone Callback() {
    return [this](const TransferOutcome& outcome) {
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_[outcome.transfer_id] = outcome;
      changed_.notify_all();
    };
  }
  bool Wait(size_t count, absl::Duration timeout = absl::Seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                             [&] { return outcomes_.size() >= count; });
  }
  std::optional<TransferOutcome> Get(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = outcomes_.find(id);
    if (found == outcomes_.end()) return std::nullopt;
    return found->second;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<uint64_t, TransferOutcome> outcomes_;
};

struct Fixture {
  explicit Fixture(uint64_t bytes) : source(bytes), destination(bytes, 0) {
    FillPattern(absl::MakeSpan(source), 9);
    LoopbackOptions options;
    options.lanes = 2;
    fault = std::make_unique<FaultTransport>(LoopbackTransport::Create(options).value());
    receiver = LoopbackTransport::Create(options).value();
    source_region = fault->Register({source.data(), source.size()}).value();
    EXPECT_TRUE(receiver->Register({destination.data(), destination.size()}).ok());
    const v1::HandshakeDescriptor d = receiver->LocalDescriptor().value();
    peer = fault->Connect(d).value();
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
  std::unique_ptr<FaultTransport> fault;
  std::unique_ptr<LoopbackTransport> receiver;
  transport::RegionId source_region = 0;
  transport::PeerId peer = 0;
  std::shared_ptr<const transport::RemoteRegions> regions;
};

// A lane stops with the transfer's writes on it (held, as a stalled peer's would be): the cancelled
// transfer's outcome waits until they were let go and landed, and a flush came back after them.
TEST(SchedulerFaultTest, ACancelledTransferOnAStoppedLaneReportsOnlyAfterItsHeldWritesLanded) {
  Fixture f(4 * kMiB);
  Scheduler scheduler(f.fault.get(), {.slice_bytes = 256 << 10, .fence_timeout = absl::Hours(1)});
  Outcomes outcomes;
  ASSERT_TRUE(f.fault->StopLane(0).ok());
  ASSERT_TRUE(f.fault->StopLane(1).ok());
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4 * kMiB}}, outcomes.Callback())).ok());
  while (f.fault->counters().held[0] + f.fault->counters().held[1] == 0) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(scheduler.Cancel(1, "the engine aborted transfer 1").ok());
  EXPECT_FALSE(outcomes.Wait(1, absl::Milliseconds(100))) << "Failed while writes were held";
  ASSERT_TRUE(f.fault->ResumeLane(0).ok());
  ASSERT_TRUE(f.fault->ResumeLane(1).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = *outcomes.Get(1);
  EXPECT_EQ(outcome.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(outcome.fence_proven);
  // Whatever was posted landed before the outcome: nothing changes after it.
  const std::vector<uint8_t> at_outcome = f.destination;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(std::memcmp(at_outcome.data(), f.destination.data(), at_outcome.size()), 0);
}

// A lane that never comes back: the fence bound disconnects the peer, which drops the held
// writes (they never reach the backend), and nothing lands after the outcome.
TEST(SchedulerFaultTest, AStoppedLaneThatNeverResumesIsFencedByDisconnectAndDropsItsWrites) {
  Fixture f(4 * kMiB);
  Scheduler scheduler(f.fault.get(),
                      {.slice_bytes = 256 << 10, .fence_timeout = absl::Milliseconds(50)});
  Outcomes outcomes;
  ASSERT_TRUE(f.fault->StopLane(0).ok());
  ASSERT_TRUE(f.fault->StopLane(1).ok());
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4 * kMiB}}, outcomes.Callback())).ok());
  ASSERT_TRUE(scheduler.Cancel(1, "the engine aborted transfer 1").ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = *outcomes.Get(1);
  EXPECT_TRUE(outcome.peer_disconnected);
  EXPECT_TRUE(outcome.fence_proven);  // the loopback backend's disconnect fences
  (void)f.fault->ResumeLane(0);
  (void)f.fault->ResumeLane(1);
  absl::SleepFor(absl::Milliseconds(100));
  for (uint8_t byte : f.destination) ASSERT_EQ(byte, 0) << "a held write landed after the fence";
  EXPECT_GT(f.fault->counters().dropped, 0u);
}

// An injected write failure fails the transfer with the backend's reason; the sibling writes
// already on the other lane finish before the outcome.
TEST(SchedulerFaultTest, AFailedWriteFailsTheTransferOnlyOnceTheOtherLaneDrained) {
  Fixture f(4 * kMiB);
  Scheduler scheduler(f.fault.get(), {.slice_bytes = 256 << 10});
  Outcomes outcomes;
  ASSERT_TRUE(f.fault
                  ->FailNext(FaultTransport::Op::kPostWrites, 1,
                             absl::UnavailableError("injected: the NIC said no"),
                             FaultTransport::FailMode::kCompleted)
                  .ok());
  ASSERT_TRUE(scheduler.Submit(f.MakeTransfer(1, {{0, 0, 4 * kMiB}}, outcomes.Callback())).ok());
  ASSERT_TRUE(outcomes.Wait(1));
  const TransferOutcome outcome = *outcomes.Get(1);
  EXPECT_FALSE(outcome.status.ok());
  const std::vector<uint8_t> at_outcome = f.destination;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(std::memcmp(at_outcome.data(), f.destination.data(), at_outcome.size()), 0);
}

}  // namespace
}  // namespace kvrail::transfer
