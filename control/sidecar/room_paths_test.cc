// A room's failure paths through a prefill and a decode sidecar in this process (SidecarPair: a
// bootstrap server, the loopback backend): the ledgers' timeouts, on an injected room clock
// (SidecarOptions::clock) that the test moves forward, so that a timeout of minutes is reached in
// the ticker's next turn (50 ms of real time); a decode that goes away; an engine that attaches
// again. What each engine hears is checked end to end: the cause and reason of the Failed event
// on each side, whether the decode's pages were held, and that their release was proven by the
// prefill's fence answer.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "control/engine_api/engine_api.h"
#include "control/engine_api/sidecar_arena.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/small_room.h"
#include "control/sidecar/sidecar_pair.h"
#include "engine/transport/fault/fault_transport.h"

namespace kvrail::sidecar {
namespace {

using layout::testing::RoomManifest;
using layout::testing::SmallContract;

class RoomPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::SidecarPair>> pair =
        testing::SidecarPair::Start([this](SidecarOptions& options) {
          options.clock = [this] { return absl::Now() + absl::Seconds(skipped_.load()); };
          options.timeouts.heartbeat_interval = absl::Seconds(2);  // the shortest: probes
          if (options.role != Role::kPrefill) return;
          // The prefill writes through the fault-injecting transport (no fault set: it forwards
          // every call unchanged).
          options.transfer_deadline = transfer_deadline_;
          options.fence_timeout = absl::Milliseconds(500);
          options.wrap_transport = [this](std::unique_ptr<transport::Transport> inner) {
            auto fault = std::make_unique<transport::FaultTransport>(std::move(inner));
            fault_ = fault.get();
            return std::unique_ptr<transport::Transport>(std::move(fault));
          };
        });
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = *std::move(pair);
    prefill_ = Attach(pair_->prefill().engine_endpoint());
    prefill_engine_token_ = last_engine_token_;
    decode_ = Attach(pair_->decode().engine_endpoint(), "", &decode_arena_);
  }

  // `engine_token`: a takeover's proof, from an earlier attach's reply (ENGINE-API.md).
  std::unique_ptr<engine_api::EngineApiClient> Attach(
      const std::string& endpoint, const std::string& engine_token = "",
      std::optional<engine_api::SidecarArena>* arena = nullptr) {
    auto client = engine_api::EngineApiClient::Connect(endpoint).value();
    v1::EngineRequest attach;
    attach.mutable_attach()->set_allocate_bytes(contract_.ArenaBytes());
    attach.mutable_attach()->set_contract(layout::SerializeContract(contract_).value());
    attach.mutable_attach()->set_engine_token(engine_token);
    absl::StatusOr<v1::EngineReply> reply = client->Call(attach, absl::Seconds(30));
    EXPECT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
    if (reply.ok()) last_engine_token_ = reply->engine_token();
    if (reply.ok() && arena != nullptr) {
      absl::StatusOr<engine_api::SidecarArena> mapped =
          engine_api::MapSidecarArena(*reply, contract_.ArenaBytes());
      EXPECT_TRUE(mapped.ok()) << mapped.status();
      if (mapped.ok()) arena->emplace(*std::move(mapped));
    }
    return client;
  }

  // Moves the room clock of both sidecars forward.
  void Skip(absl::Duration by) { skipped_ += absl::ToInt64Seconds(by); }

  void Expect(uint64_t room) {
    v1::EngineRequest expect;
    expect.mutable_expect()->set_room(room);
    expect.mutable_expect()->set_bootstrap_address(pair_->bootstrap());
    expect.mutable_expect()->set_destination_manifest(
        layout::SerializeManifest(RoomManifest(contract_, {4, 7, 9})).value());
    absl::StatusOr<v1::EngineReply> reply = decode_->Call(expect);
    ASSERT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
  }

  void Ready(uint64_t room) {
    v1::EngineRequest ready;
    ready.mutable_ready()->set_room(room);
    ready.mutable_ready()->set_source_manifest(
        layout::SerializeManifest(RoomManifest(contract_, {1, 2, 3})).value());
    ready.mutable_ready()->set_bootstrap_token(7);
    absl::StatusOr<v1::EngineReply> reply = prefill_->Call(ready);
    ASSERT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
  }

  // Whether every byte of the decode's arena is still zero: nothing of any room landed.
  bool DecodeArenaUntouched() const {
    for (uint8_t b : decode_arena_->bytes()) {
      if (b != 0) return false;
    }
    return true;
  }

  void Begin(uint64_t room) {
    v1::EngineRequest begin;
    begin.mutable_begin()->set_room(room);
    absl::StatusOr<v1::EngineReply> reply = prefill_->Call(begin);
    ASSERT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
  }

  // The state the prefill's ledger has for `room` now (Poll).
  v1::TransferPoll PrefillState(uint64_t room) {
    v1::EngineRequest poll;
    poll.mutable_poll()->add_rooms(room);
    absl::StatusOr<v1::EngineReply> reply = prefill_->Call(poll);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->states(0).status() : v1::TRANSFER_POLL_FAILED;
  }

  // Waits until the prefill holds every pre-allocation of `room`.
  void AwaitPreallocated(uint64_t room) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (PrefillState(room) != v1::TRANSFER_POLL_BOOTSTRAPPED) {
      ASSERT_LT(absl::Now(), deadline) << "room " << room << " was never pre-allocated";
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  // The next event of `client` that is not a Bootstrapped announcement.
  static std::optional<v1::RoomEvent> NextEnd(engine_api::EngineApiClient& client) {
    while (true) {
      std::optional<v1::RoomEvent> event = client.NextEvent(absl::Seconds(30));
      if (!event || event->status() != v1::TRANSFER_POLL_BOOTSTRAPPED) return event;
    }
  }

  const layout::Contract contract_ = SmallContract();
  std::string last_engine_token_;     // of the last accepted attach
  std::string prefill_engine_token_;  // the prefill engine's
  std::atomic<int64_t> skipped_{0};   // seconds the room clock is ahead of the real one
  // Long enough for a room to land under a sanitizer on a loaded machine; the test of the
  // deadline itself gives a stuck transfer up quickly (RoomPathsDeadlineTest).
  absl::Duration transfer_deadline_ = absl::Seconds(30);
  std::unique_ptr<testing::SidecarPair> pair_;
  std::unique_ptr<engine_api::EngineApiClient> prefill_, decode_;
  std::optional<engine_api::SidecarArena> decode_arena_;  // mapped here, to watch its bytes
  transport::FaultTransport* fault_ = nullptr;            // the prefill's data plane
};

// A begun prefill room that no decode pre-allocates fails after --bootstrap-timeout (CACHEPD
// §7.4), naming the limit.
TEST_F(RoomPathsTest, APrefillRoomNobodyPreallocatesFailsAtItsBootstrapTimeout) {
  Begin(1);
  Skip(absl::Seconds(119));
  absl::SleepFor(absl::Milliseconds(200));  // four turns of the ticker: nothing yet
  EXPECT_EQ(PrefillState(1), v1::TRANSFER_POLL_BOOTSTRAPPING);
  Skip(absl::Seconds(2));
  std::optional<v1::RoomEvent> failed = NextEnd(*prefill_);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 1u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(failed->cause(), "timeout");
  EXPECT_TRUE(absl::StrContains(failed->reason(), "bootstrap timeout")) << failed->reason();
}

// A decode's pre-allocation that no prefill request matches: the prefill gives the room up after
// its wait (CACHEPD §11.2), and the decode hears the prefill's own cause and reason (kvrail's
// room outcome), its pages held until the prefill's fence answer proves them safe.
TEST_F(RoomPathsTest, AnUnmatchedPreallocationFailsOnBothSidesWithThePrefillsReason) {
  Expect(2);
  AwaitPreallocated(2);
  Skip(absl::Seconds(121));
  std::optional<v1::RoomEvent> failed = NextEnd(*decode_);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 2u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(failed->cause(), "timeout") << failed->reason();
  EXPECT_TRUE(absl::StrContains(failed->reason(), "pre-allocations unmatched")) << failed->reason();
  ASSERT_EQ(failed->pages(), v1::PAGES_HELD);  // the prefill rank may have written them
  std::optional<v1::RoomEvent> released = NextEnd(*decode_);
  ASSERT_TRUE(released.has_value());
  EXPECT_TRUE(released->pages_released());
  EXPECT_TRUE(released->pages_proven()) << released->reason();
}

// A decode room whose prefill engine began it but never said Ready fails at --waiting-timeout:
// its pages are held, the prefill is asked to fence the room (its engine hears Failed), and
// the prefill's answer releases them, proven.
TEST_F(RoomPathsTest, ADecodeWaitingTimeoutFencesThroughThePrefillAndReleasesProven) {
  Expect(3);
  AwaitPreallocated(3);
  Begin(3);
  Skip(absl::Seconds(299));
  absl::SleepFor(absl::Milliseconds(200));
  Skip(absl::Seconds(2));
  std::optional<v1::RoomEvent> failed = NextEnd(*decode_);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 3u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(failed->cause(), "timeout") << failed->reason();
  EXPECT_EQ(failed->pages(), v1::PAGES_HELD);
  std::optional<v1::RoomEvent> released = NextEnd(*decode_);
  ASSERT_TRUE(released.has_value());
  EXPECT_TRUE(released->pages_released());
  EXPECT_TRUE(released->pages_proven()) << released->reason();
  std::optional<v1::RoomEvent> prefill_failed = NextEnd(*prefill_);
  ASSERT_TRUE(prefill_failed.has_value());
  EXPECT_EQ(prefill_failed->room(), 3u);
  EXPECT_EQ(prefill_failed->status(), v1::TRANSFER_POLL_FAILED);
}

// A decode that goes away (its sidecar stopped: nobody listens on its handshake port any more):
// the prefill's next probe drops its session, and the room it was to write fails on the
// prefill, naming the session, with the cause peer_failed.
TEST_F(RoomPathsTest, ADecodeThatGoesAwayIsDroppedAndItsRoomsFailOnThePrefill) {
  Expect(4);
  AwaitPreallocated(4);
  Begin(4);
  const std::string session = pair_->decode().session_id();
  pair_->decode().Stop();
  std::optional<v1::RoomEvent> failed = NextEnd(*prefill_);  // within a heartbeat (2 s)
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 4u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(failed->cause(), "peer_failed") << failed->reason();
  EXPECT_TRUE(absl::StrContains(failed->reason(), session)) << failed->reason();
  EXPECT_EQ(pair_->prefill().stats().registrations, 0u) << "the session's registration went";
}

// An engine that attaches the same arena again (it restarted): the rooms its predecessor had
// begun fail on the prefill ("void"), and the decode hears the prefill's reason.
TEST_F(RoomPathsTest, AReattachVoidsTheRoomsTheEngineHadBegun) {
  Expect(5);
  AwaitPreallocated(5);
  Begin(5);
  std::unique_ptr<engine_api::EngineApiClient> again =
      Attach(pair_->prefill().engine_endpoint(), prefill_engine_token_);
  std::optional<v1::RoomEvent> failed = NextEnd(*again);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 5u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_TRUE(absl::StrContains(failed->reason(), "attached again")) << failed->reason();
  std::optional<v1::RoomEvent> decode_failed = NextEnd(*decode_);
  ASSERT_TRUE(decode_failed.has_value());
  EXPECT_EQ(decode_failed->room(), 5u);
  EXPECT_TRUE(absl::StrContains(decode_failed->reason(), "attached again"))
      << decode_failed->reason();
}

// A write the data plane fails (its completion reports the link broken; nothing of it lands):
// the room fails on the prefill once fenced, the decode hears the prefill's reason, its pages
// are released once the prefill answered its fence, and no byte of the room ever landed.
TEST_F(RoomPathsTest, AWriteThatFailsFailsTheRoomOnBothSidesAndNothingLands) {
  Expect(6);
  AwaitPreallocated(6);
  ASSERT_TRUE(fault_
                  ->FailNext(transport::FaultTransport::Op::kPostWrites, 1000,
                             absl::UnavailableError("injected: the link broke"),
                             transport::FaultTransport::FailMode::kCompleted)
                  .ok());
  Ready(6);
  std::optional<v1::RoomEvent> failed = NextEnd(*prefill_);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 6u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_TRUE(absl::StrContains(failed->reason(), "injected: the link broke")) << failed->reason();
  std::optional<v1::RoomEvent> decode_failed = NextEnd(*decode_);
  ASSERT_TRUE(decode_failed.has_value());
  EXPECT_EQ(decode_failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(decode_failed->cause(), failed->cause()) << decode_failed->reason();
  EXPECT_TRUE(absl::StrContains(decode_failed->reason(), "injected: the link broke"))
      << decode_failed->reason();
  if (decode_failed->pages() == v1::PAGES_HELD) {
    std::optional<v1::RoomEvent> released = NextEnd(*decode_);
    ASSERT_TRUE(released.has_value());
    EXPECT_TRUE(released->pages_released());
  }
  EXPECT_TRUE(DecodeArenaUntouched());
}

// A room that lands warms its route: the next room of that decode is prepared and submitted on
// the prefill's owner, over the owner's copy of the link. When a write then breaks the link, the
// prefill drops it, and the owner's copy with it: the room after the quarantine connects afresh
// and lands (over the dropped link, its writes would fail).
TEST_F(RoomPathsTest, ARoomAfterABrokenLinkConnectsAfreshAndLands) {
  const auto move_room = [&](uint64_t room) -> std::pair<v1::RoomEvent, v1::RoomEvent> {
    Expect(room);
    AwaitPreallocated(room);
    Ready(room);
    std::optional<v1::RoomEvent> sent = NextEnd(*prefill_);
    std::optional<v1::RoomEvent> landed = NextEnd(*decode_);
    EXPECT_TRUE(sent.has_value() && landed.has_value());
    if (!sent || !landed) return {};
    EXPECT_EQ(sent->room(), room);
    EXPECT_EQ(landed->room(), room);
    return {*sent, *landed};
  };
  for (uint64_t room : {20, 21}) {  // the second over the warm route
    auto [sent, landed] = move_room(room);
    EXPECT_EQ(sent.status(), v1::TRANSFER_POLL_SUCCESS) << sent.reason();
    EXPECT_EQ(landed.status(), v1::TRANSFER_POLL_SUCCESS) << landed.reason();
  }
  ASSERT_TRUE(fault_
                  ->FailNext(transport::FaultTransport::Op::kPostWrites, 1000,
                             absl::UnavailableError("injected: the link broke"),
                             transport::FaultTransport::FailMode::kCompleted)
                  .ok());
  {
    auto [sent, landed] = move_room(22);
    EXPECT_EQ(sent.status(), v1::TRANSFER_POLL_FAILED);
    EXPECT_EQ(landed.status(), v1::TRANSFER_POLL_FAILED);
    if (landed.pages() == v1::PAGES_HELD) {
      std::optional<v1::RoomEvent> released = NextEnd(*decode_);
      ASSERT_TRUE(released.has_value());
      EXPECT_TRUE(released->pages_released());
    }
  }
  ASSERT_TRUE(
      fault_
          ->FailNext(transport::FaultTransport::Op::kPostWrites, 0, absl::UnavailableError("none"))
          .ok());
  Skip(absl::Seconds(60));  // past the session's quarantine (FAILED_SESSION_TTL, 30 s)
  auto [sent, landed] = move_room(23);
  EXPECT_EQ(sent.status(), v1::TRANSFER_POLL_SUCCESS) << sent.reason();
  EXPECT_EQ(landed.status(), v1::TRANSFER_POLL_SUCCESS) << landed.reason();
}

// A transfer whose writes never complete (every lane stopped) fails at its deadline, once
// fenced (the stuck peer disconnected: its held writes dropped), with the cause timeout on both
// sides; nothing of it lands, then or after.
class RoomPathsDeadlineTest : public RoomPathsTest {
 protected:
  RoomPathsDeadlineTest() { transfer_deadline_ = absl::Milliseconds(300); }
};

TEST_F(RoomPathsDeadlineTest, ATransferPastItsDeadlineFailsOnceFencedAndNothingLands) {
  Expect(7);
  AwaitPreallocated(7);
  const int lanes = fault_->capabilities().lanes;
  for (int lane = 0; lane < lanes; ++lane) ASSERT_TRUE(fault_->StopLane(lane).ok());
  Ready(7);
  std::optional<v1::RoomEvent> failed = NextEnd(*prefill_);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 7u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(failed->cause(), "timeout") << failed->reason();
  std::optional<v1::RoomEvent> decode_failed = NextEnd(*decode_);
  ASSERT_TRUE(decode_failed.has_value());
  EXPECT_EQ(decode_failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(decode_failed->cause(), "timeout") << decode_failed->reason();
  for (int lane = 0; lane < lanes; ++lane) {
    ASSERT_TRUE(fault_->ResumeLane(lane).ok());  // what was held went with the disconnect
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(DecodeArenaUntouched());
}

}  // namespace
}  // namespace kvrail::sidecar
