// Row staging (control/wire/row_staging.h; row_staging.cc) through a TP-2 prefill node and a TP-1
// decode in this process (SidecarPair: a bootstrap server, the loopback backend), arenas
// allocated by the sidecars and mapped here, driven through the engine API as engines would. A
// head-sliced room's rows land apart in the decode's pages; with --row-staging all, each prefill
// rank writes them back to back into a slot the decode offered, and the decode scatters them
// into the pages before that rank's Success counts. Every byte of every room is checked against
// the prefill arenas, and the slots are seen to come back: after a Success, after an abort's
// fence, and when there is no room for a slot the rank writes in place.
#include "control/wire/row_staging.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/engine_api/engine_api.h"
#include "control/engine_api/sidecar_arena.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/sidecar/sidecar_pair.h"
#include "engine/transport/fault/fault_transport.h"
#include "engine/transport/handshake/handshake.h"

namespace kvrail::sidecar {
namespace {

constexpr int kPrefillTp = 2;

layout::KvShape Shape() {
  layout::KvShape shape;
  shape.layers = 2;
  shape.kv_heads = 4;
  shape.head_dim = 32;  // 2 heads of 32 bf16 a prefill rank's row: 128 bytes, 256 apart here
  shape.pages = 16;
  return shape;
}

// An engine rank: its engine API client and the arena its sidecar allocated, mapped here.
struct Engine {
  std::unique_ptr<engine_api::EngineApiClient> client;
  std::optional<engine_api::SidecarArena> arena;
};

class RowStagingTest : public ::testing::Test {
 protected:
  // `slots`: how many (room, rank) slots the decode's staging memory holds; `more`: a case's
  // own options, after the fixture's.
  void Start(int slots, bool verify_digest = false,
             const std::function<void(SidecarOptions&)>& more = nullptr) {
    const uint64_t slot_bytes = RankBytes();
    absl::StatusOr<std::unique_ptr<testing::SidecarPair>> pair = testing::SidecarPair::Start(
        [&](SidecarOptions& options) {
          options.verify_digest = verify_digest;
          if (more) more(options);
          // A failed transfer does not quarantine its session (CACHEPD §7.4): the room after a
          // failed one goes through at once.
          options.timeouts.failed_session_ttl = absl::ZeroDuration();
          if (options.role == Role::kPrefill && options.tp_rank == 0) {
            // Prefill rank 0 writes through the fault-injecting transport (no fault set: it
            // forwards every call unchanged).
            options.wrap_transport = [this](std::unique_ptr<transport::Transport> inner) {
              auto fault = std::make_unique<transport::FaultTransport>(std::move(inner));
              fault_ = fault.get();
              return std::unique_ptr<transport::Transport>(std::move(fault));
            };
          }
          if (options.role != Role::kDecode) return;
          options.row_staging_bytes = slots * ((slot_bytes + 4095) / 4096 * 4096);
          options.row_staging = SidecarOptions::RowStaging::kAll;  // loopback writes rows whole
        },
        kPrefillTp);
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = *std::move(pair);
    for (int rank = 0; rank < kPrefillTp; ++rank) {
      prefills_.push_back(Open(pair_->prefill(rank).engine_endpoint(), prefill_contract_));
      ASSERT_TRUE(prefills_.back().arena.has_value());
      std::mt19937 random(11 + rank);
      for (uint8_t& b : prefills_.back().arena->bytes()) b = static_cast<uint8_t>(random() | 1);
    }
    decode_ = Open(pair_->decode().engine_endpoint(), decode_contract_);
    ASSERT_TRUE(decode_.arena.has_value());
  }

  Engine Open(const std::string& endpoint, const layout::Contract& contract) {
    Engine engine;
    engine.client = engine_api::EngineApiClient::Connect(endpoint).value();
    v1::EngineRequest attach;
    attach.mutable_attach()->set_allocate_bytes(contract.ArenaBytes());
    attach.mutable_attach()->set_contract(layout::SerializeContract(contract).value());
    absl::StatusOr<v1::EngineReply> reply = engine.client->Call(attach, absl::Seconds(30));
    EXPECT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
    if (!reply.ok()) return engine;
    absl::StatusOr<engine_api::SidecarArena> arena =
        engine_api::MapSidecarArena(*reply, contract.ArenaBytes());
    EXPECT_TRUE(arena.ok()) << arena.status();
    if (arena.ok()) engine.arena.emplace(*std::move(arena));
    return engine;
  }

  static layout::Manifest Room(const layout::Contract& contract, int64_t first) {
    const std::vector<std::vector<int64_t>> table = {{first, first + 3, first + 5}};
    return layout::BuildManifest(contract, table, 0, 48).value();
  }

  // The copies prefill rank `rank` makes for a room (its planner, as the sidecar binds it).
  plan::CopyList CopiesOf(int rank, const layout::Manifest& src,
                          const layout::Manifest& dst) const {
    const plan::Planner planner =
        plan::Planner::Create(kPrefillTp, 1, prefill_contract_, decode_contract_).value();
    const plan::RegistrationOutcome outcome = planner.OnRegistration(rank, 0);
    const plan::CopyPlan bound = plan::CopyPlan::Bind(prefill_contract_, decode_contract_,
                                                      outcome.fragments, outcome.owner_filters)
                                     .value();
    plan::CopyList copies;
    EXPECT_TRUE(bound.Expand(src, dst, copies).ok());
    return copies;
  }

  // The bytes one prefill rank writes for a room of 3 blocks: a slot's size.
  uint64_t RankBytes() const {
    uint64_t bytes = 0;
    for (const plan::Copy& c : CopiesOf(0, Room(prefill_contract_, 1), Room(decode_contract_, 1))) {
      bytes += PayloadBytes(c);
    }
    return bytes;
  }

  // Moves room `room` (destination blocks from `first`) and waits for its decode Success.
  void Move(uint64_t room, int64_t first) {
    Expect(room, first);
    Land(room, first);
  }

  // Moves an expected room: both prefill ranks Ready, its decode Success, every byte checked.
  void Land(uint64_t room, int64_t first) {
    for (Engine& prefill : prefills_) Ready(prefill, room);
    ASSERT_EQ(AwaitDecode(room), v1::TRANSFER_POLL_SUCCESS) << "room " << room;
    // Every byte each rank's copies write is its source byte.
    const layout::Manifest src = Room(prefill_contract_, 1);
    const layout::Manifest dst = Room(decode_contract_, first);
    for (int rank = 0; rank < kPrefillTp; ++rank) {
      const uint8_t* from = prefills_[rank].arena->bytes().data();
      const uint8_t* to = decode_.arena->bytes().data();
      for (const plan::Copy& c : CopiesOf(rank, src, dst)) {
        for (uint64_t i = 0; i < c.length; ++i) {
          ASSERT_EQ(to[c.dst_offset + i], from[c.src_offset + i])
              << "room " << room << ", rank " << rank << ", decode offset " << c.dst_offset + i;
        }
      }
    }
  }

  void Expect(uint64_t room, int64_t first) {
    v1::EngineRequest expect;
    expect.mutable_expect()->set_room(room);
    expect.mutable_expect()->set_bootstrap_address(pair_->bootstrap());
    expect.mutable_expect()->set_destination_manifest(
        layout::SerializeManifest(Room(decode_contract_, first)).value());
    absl::StatusOr<v1::EngineReply> reply = decode_.client->Call(expect);
    ASSERT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
  }

  void Ready(Engine& prefill, uint64_t room) {
    v1::EngineRequest ready;
    ready.mutable_ready()->set_room(room);
    ready.mutable_ready()->set_source_manifest(
        layout::SerializeManifest(Room(prefill_contract_, 1)).value());
    ready.mutable_ready()->set_bootstrap_token(7);
    absl::StatusOr<v1::EngineReply> reply = prefill.client->Call(ready);
    ASSERT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
  }

  v1::RoomState Poll(Engine& engine, uint64_t room) {
    v1::EngineRequest poll;
    poll.mutable_poll()->add_rooms(room);
    absl::StatusOr<v1::EngineReply> reply = engine.client->Call(poll);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->states(0) : v1::RoomState();
  }

  // The decode's state of `room` once it is Success or Failed, or after 30 s, whatever it is.
  v1::TransferPoll AwaitDecode(uint64_t room) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (true) {
      const v1::TransferPoll state = Poll(decode_, room).status();
      if (state == v1::TRANSFER_POLL_SUCCESS || state == v1::TRANSFER_POLL_FAILED ||
          absl::Now() > deadline) {
        return state;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  // Waits until the prefill ranks hold the room's pre-allocations (Bootstrapped).
  void AwaitPreallocated(uint64_t room) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (Engine& prefill : prefills_) {
      while (Poll(prefill, room).status() != v1::TRANSFER_POLL_BOOTSTRAPPED) {
        ASSERT_LT(absl::Now(), deadline) << "room " << room << " was never pre-allocated";
        absl::SleepFor(absl::Milliseconds(2));
      }
    }
  }

  void AbortOnDecode(uint64_t room) {
    v1::EngineRequest abort;
    abort.mutable_abort()->set_room(room);
    absl::StatusOr<v1::EngineReply> reply = decode_.client->Call(abort);
    ASSERT_TRUE(reply.ok() && reply->error().empty()) << reply.status();
  }

  // The decode's event that gives `room`'s pages back (after its fence), or nullopt after 30 s.
  std::optional<v1::RoomEvent> AwaitPagesReleased(uint64_t room) {
    while (true) {
      std::optional<v1::RoomEvent> event = decode_.client->NextEvent(absl::Seconds(30));
      if (!event.has_value()) return std::nullopt;
      if (event->room() == room && event->pages_released()) return event;
    }
  }

  SidecarStats DecodeStats() { return pair_->decode().stats(); }

  const layout::Contract prefill_contract_ = layout::BuildKvContract(Shape(), kPrefillTp).value();
  const layout::Contract decode_contract_ = layout::BuildKvContract(Shape(), 1).value();
  transport::FaultTransport* fault_ = nullptr;  // prefill rank 0's data plane
  std::unique_ptr<testing::SidecarPair> pair_;
  std::vector<Engine> prefills_;
  Engine decode_;
};

TEST_F(RowStagingTest, EachRanksRowsAreStagedAndScatteredIntoThePagesByteExact) {
  Start(/*slots=*/4);
  Move(1, 1);
  Move(2, 4);  // the slots came back after the first room's Success
  const SidecarStats stats = DecodeStats();
  EXPECT_EQ(stats.rows_scattered, 4u);
  EXPECT_EQ(stats.row_staging_full, 0u);
}

// One slot for two ranks: the rank that gets none writes its rows in place (answering
// "in_place" to nothing: it was offered nothing), the other stages; both land exactly.
TEST_F(RowStagingTest, ARankOfferedNoSlotWritesInPlaceBesideOneThatStages) {
  Start(/*slots=*/1);
  Move(1, 1);
  EXPECT_EQ(DecodeStats().rows_scattered, 1u);
  EXPECT_EQ(DecodeStats().row_staging_full, 1u);
  Move(2, 4);
  EXPECT_EQ(DecodeStats().rows_scattered, 2u) << "the slot did not come back after Success";
}

// --verify-digest: the decode hashes its pages once the rows are scattered, and the digests
// agree.
TEST_F(RowStagingTest, DigestsAreCheckedOnThePagesAfterTheScatter) {
  Start(/*slots=*/2, /*verify_digest=*/true);
  Move(1, 1);
  const SidecarStats stats = DecodeStats();
  EXPECT_EQ(stats.rows_scattered, 2u);
  EXPECT_EQ(stats.room_digests, 2u);
  EXPECT_EQ(stats.room_digests_failed, 0u);
}

// An abort on the decode before the prefill ranks' Ready: the room fails there, its pages held
// until both ranks fenced it; the slots come back with the pages, and the next room stages
// again into the same memory, exactly.
TEST_F(RowStagingTest, AnAbortedRoomsSlotsComeBackWithItsPages) {
  Start(/*slots=*/2);
  Expect(1, 1);
  AwaitPreallocated(1);
  AbortOnDecode(1);
  ASSERT_EQ(AwaitDecode(1), v1::TRANSFER_POLL_FAILED);
  // Its pages come back once both ranks answered the fence (an event of their own).
  std::optional<v1::RoomEvent> released = AwaitPagesReleased(1);
  ASSERT_TRUE(released.has_value()) << "the aborted room's pages were never released";
  EXPECT_TRUE(released->pages_proven());
  Move(2, 4);
  EXPECT_EQ(DecodeStats().rows_scattered, 2u);
  EXPECT_EQ(DecodeStats().row_staging_full, 0u) << "the aborted room's slots did not come back";
  EXPECT_EQ(DecodeStats().row_staging_quarantined, 0u);
}

// A write of prefill rank 0 fails on the wire: its room fails on both sides, with its rows
// partly in its slot; the decode's pages are held until both ranks fenced the room, and the
// slots come back with them: the next room stages both ranks again, exactly.
TEST_F(RowStagingTest, AFailedWriteFailsTheRoomAndItsSlotsComeBackAfterTheFence) {
  Start(/*slots=*/2);
  ASSERT_NE(fault_, nullptr);
  ASSERT_TRUE(fault_
                  ->FailNext(transport::FaultTransport::Op::kPostWrites, 1,
                             absl::UnavailableError("injected: the link went down"),
                             transport::FaultTransport::FailMode::kCompleted)
                  .ok());
  Expect(1, 1);
  for (Engine& prefill : prefills_) Ready(prefill, 1);
  ASSERT_EQ(AwaitDecode(1), v1::TRANSFER_POLL_FAILED);
  std::optional<v1::RoomEvent> released = AwaitPagesReleased(1);
  ASSERT_TRUE(released.has_value()) << "the failed room's pages were never released";
  EXPECT_TRUE(released->pages_proven());
  const uint64_t scattered = DecodeStats().rows_scattered;  // rank 1's, if it got there first
  Move(2, 4);
  EXPECT_EQ(DecodeStats().rows_scattered, scattered + 2);
  EXPECT_EQ(DecodeStats().row_staging_full, 0u) << "the failed room's slots did not come back";
  EXPECT_EQ(DecodeStats().row_staging_quarantined, 0u);
}

// A prefill rank offered a slot that sends its Success without answering the offer (here its
// answer is withheld, as a peer of another version would never send one): its rows may be in the
// slot or in the pages, so the Success cannot count, and the room fails on the decode with the
// reason; the engine never sees a Success. The fence proves the room, the slots come back, and the
// next room stages both ranks again, exactly.
TEST_F(RowStagingTest, ASuccessWithoutItsStagingAnswerFailsTheRoom) {
  std::atomic<bool> withhold{true};
  Start(/*slots=*/2, /*verify_digest=*/false, [&withhold](SidecarOptions& options) {
    if (options.role != Role::kPrefill || options.tp_rank != 0) return;
    options.intercept_message = [&withhold](std::vector<std::string>& frames) {
      return !(withhold.load() && wire::IsStagingAnswer(frames));
    };
  });
  Expect(1, 1);
  for (Engine& prefill : prefills_) Ready(prefill, 1);
  ASSERT_EQ(AwaitDecode(1), v1::TRANSFER_POLL_FAILED);
  const v1::RoomState state = Poll(decode_, 1);
  EXPECT_NE(state.reason().find("prefill rank 0 sent Success without answering the staging"),
            std::string::npos)
      << state.reason();
  std::optional<v1::RoomEvent> released = AwaitPagesReleased(1);
  ASSERT_TRUE(released.has_value()) << "the room's pages were never released";
  EXPECT_TRUE(released->pages_proven());
  withhold = false;
  const uint64_t scattered = DecodeStats().rows_scattered;  // rank 1's, if it came first
  Move(2, 4);
  EXPECT_EQ(DecodeStats().rows_scattered, scattered + 2);
  EXPECT_EQ(DecodeStats().row_staging_full, 0u) << "the failed room's slots did not come back";
}

// A room whose fence the decode cannot prove (prefill rank 0's writes are held on its lanes past
// the decode's fence wait): its pages go back as not provably safe, and rank 0's slot is kept
// out of use for good, so that the held writes, which land in it later, land in no other room's
// rows. The next room has one slot for two ranks: one stages, the other writes in place; both
// land exactly.
TEST_F(RowStagingTest, AnUnprovenFenceKeepsTheSlotOutOfUseAndItsLateWritesLandInNoRoom) {
  Start(/*slots=*/2, /*verify_digest=*/false, [](SidecarOptions& options) {
    if (options.role == Role::kDecode) options.fence_wait = absl::Milliseconds(300);
    // The stuck rank does not give its writes up (disconnect) before the test resumes them.
    if (options.role == Role::kPrefill) options.fence_timeout = absl::Seconds(60);
  });
  ASSERT_NE(fault_, nullptr);
  Expect(1, 1);
  AwaitPreallocated(1);
  const int lanes = fault_->capabilities().lanes;
  for (int lane = 0; lane < lanes; ++lane) ASSERT_TRUE(fault_->StopLane(lane).ok());
  for (Engine& prefill : prefills_) Ready(prefill, 1);
  // Rank 1's rows are scattered (its slot back); rank 0's writes are held.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (DecodeStats().rows_scattered < 1) {
    ASSERT_LT(absl::Now(), deadline) << "rank 1's rows were never scattered";
    absl::SleepFor(absl::Milliseconds(2));
  }
  AbortOnDecode(1);
  ASSERT_EQ(AwaitDecode(1), v1::TRANSFER_POLL_FAILED);
  std::optional<v1::RoomEvent> released = AwaitPagesReleased(1);
  ASSERT_TRUE(released.has_value()) << "the room's pages were never released";
  EXPECT_FALSE(released->pages_proven()) << released->reason();
  EXPECT_EQ(DecodeStats().row_staging_quarantined, 1u);
  Expect(2, 4);
  AwaitPreallocated(2);
  // Room 1's held writes land now, in rank 0's slot of room 1.
  for (int lane = 0; lane < lanes; ++lane) ASSERT_TRUE(fault_->ResumeLane(lane).ok());
  Land(2, 4);
  EXPECT_EQ(DecodeStats().rows_scattered, 2u);
  EXPECT_EQ(DecodeStats().row_staging_full, 1u) << "a slot kept out of use was offered again";
  EXPECT_EQ(DecodeStats().row_staging_quarantined, 1u);
}

// A decode that holds its session's key but lies in its staging offer (a bug, or a tenant that
// would write through the prefill into memory it does not own): the slot's address is moved
// (a) onto memory of this process that no descriptor names, and (b) across the end of a region
// of the decode's descriptor that no other region follows: half in its registered memory, half
// past it. (Memory the decode registered is its own to spoil: a slot moved wholly into it, into
// its own pages say, is taken.) The prefill's bounds check refuses each rank's transfer before
// its first byte, naming the regions; the room fails on both sides, nothing is written into the
// memory named, the decode's pages come back proven with its slots, and the next room, offered
// truly, stages both ranks and lands exactly.
class LyingOfferTest : public RowStagingTest,
                       public ::testing::WithParamInterface<bool /*unregistered*/> {};

TEST_P(LyingOfferTest, IsRefusedBeforeItsFirstByteAndTheNextRoomLands) {
  const bool unregistered = GetParam();
  constexpr int kSlots = 2;
  const uint64_t slot_bytes = (RankBytes() + 4095) / 4096 * 4096;
  std::vector<uint8_t> victim(kSlots * slot_bytes, 0x5a);  // memory no descriptor names
  std::atomic<bool> lie{true};
  std::atomic<int> lies{0};
  std::atomic<uint64_t> region_end{0};  // (b): the end of a region no other region follows
  Start(kSlots, /*verify_digest=*/false, [&](SidecarOptions& options) {
    if (options.role != Role::kDecode) return;
    options.intercept_message = [&](std::vector<std::string>& frames) {
      if (!lie.load() || !wire::IsStagingOffer(frames)) return true;
      absl::StatusOr<wire::StagingOffer> offer = wire::ParseStagingOffer(frames);
      EXPECT_TRUE(offer.ok()) << offer.status();
      if (!offer.ok()) return true;
      offer->address = unregistered
                           ? reinterpret_cast<uintptr_t>(victim.data()) + lies.load() * slot_bytes
                           : region_end.load() - offer->bytes / 2;
      frames = wire::BuildStagingOffer(*offer).value();
      ++lies;
      return true;
    };
  });
  if (!unregistered) {
    absl::StatusOr<v1::HandshakeDescriptor> descriptor =
        transport::FetchDescriptor(pair_->decode().session_id(), absl::Seconds(10));
    ASSERT_TRUE(descriptor.ok()) << descriptor.status();
    const auto& regions = descriptor->regions();
    for (const v1::Region& r : regions) {
      const uint64_t end = r.base() + r.length();
      const bool followed = std::any_of(regions.begin(), regions.end(), [&](const v1::Region& o) {
        return o.base() <= end && end < o.base() + o.length();
      });
      if (!followed) region_end = end;
    }
    ASSERT_NE(region_end.load(), 0u) << "every region of the decode is followed by another";
  }
  const std::vector<uint8_t> pages_before(decode_.arena->bytes().begin(),
                                          decode_.arena->bytes().end());
  Expect(1, 1);
  for (Engine& prefill : prefills_) Ready(prefill, 1);
  ASSERT_EQ(AwaitDecode(1), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(lies.load(), kPrefillTp);
  // Each rank's transfer is refused, unless the decode gave the room up first (the other rank's
  // Failed came before): then that rank stops before it writes.
  int refused = 0;
  for (Engine& prefill : prefills_) {
    const v1::RoomState state = Poll(prefill, 1);
    EXPECT_EQ(state.status(), v1::TRANSFER_POLL_FAILED);
    const bool bounds =
        state.reason().find("registered regions; nothing was written") != std::string::npos;
    refused += bounds ? 1 : 0;
    EXPECT_TRUE(bounds || state.reason().find("gave the room up") != std::string::npos)
        << state.reason();
  }
  EXPECT_GE(refused, 1);
  std::optional<v1::RoomEvent> released = AwaitPagesReleased(1);
  ASSERT_TRUE(released.has_value()) << "the room's pages were never released";
  EXPECT_TRUE(released->pages_proven()) << released->reason();
  EXPECT_TRUE(std::all_of(victim.begin(), victim.end(), [](uint8_t b) { return b == 0x5a; }))
      << "the prefill wrote into memory the decode does not own";
  EXPECT_TRUE(std::equal(pages_before.begin(), pages_before.end(), decode_.arena->bytes().begin()))
      << "the decode's pages changed";
  EXPECT_EQ(DecodeStats().rows_scattered, 0u);
  lie = false;
  Move(2, 4);
  EXPECT_EQ(DecodeStats().rows_scattered, 2u);
  EXPECT_EQ(DecodeStats().row_staging_full, 0u) << "the refused room's slots did not come back";
  EXPECT_EQ(DecodeStats().row_staging_quarantined, 0u);
}

INSTANTIATE_TEST_SUITE_P(Address, LyingOfferTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "OnUnregisteredMemory" : "AcrossARegionsEnd";
                         });

}  // namespace
}  // namespace kvrail::sidecar
