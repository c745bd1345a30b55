// Layer-wise streaming (CACHEPD §6.11, docs/ENGINE-API.md "Layer-wise streaming") through a
// prefill and a decode sidecar in this process (SidecarPair: a bootstrap server, the loopback
// backend), both arenas allocated by the sidecars and mapped here, driven through the engine
// API as an engine would. The test waits for bytes to land instead of timing anything: a layer
// said final lands before the room's Ready, a layer not yet final does not, the decode hears
// Success only after the Ready, and an abort between layers is fenced. And the engine's Begin,
// where such a room starts (BeginTest).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/engine_api/engine_api.h"
#include "control/engine_api/sidecar_arena.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/layout/small_room.h"
#include "control/plan/copy_plan.h"
#include "control/sidecar/sidecar_pair.h"

namespace kvrail::sidecar {
namespace {

using layout::testing::RoomManifest;
using layout::testing::SmallContract;

// An engine rank: its engine API client and the arena its sidecar allocated, mapped here.
struct Engine {
  std::unique_ptr<engine_api::EngineApiClient> client;
  std::optional<engine_api::SidecarArena> arena;
};

class LayerwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::SidecarPair>> pair = testing::SidecarPair::Start();
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = *std::move(pair);
    prefill_ = Open(pair_->prefill().engine_endpoint());
    decode_ = Open(pair_->decode().engine_endpoint());
    ASSERT_TRUE(prefill_.arena.has_value() && decode_.arena.has_value());
    std::mt19937 random(5);
    for (uint8_t& b : prefill_.arena->bytes()) b = static_cast<uint8_t>(random() | 1);
    plan_.emplace(plan::CopyPlan::Bind(contract_, contract_, {}).value());
  }

  Engine Open(const std::string& endpoint) {
    Engine engine;
    engine.client = engine_api::EngineApiClient::Connect(endpoint).value();
    v1::EngineRequest attach;
    attach.mutable_attach()->set_allocate_bytes(contract_.ArenaBytes());
    attach.mutable_attach()->set_contract(layout::SerializeContract(contract_).value());
    absl::StatusOr<v1::EngineReply> reply = engine.client->Call(attach, absl::Seconds(30));
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return engine;
    absl::StatusOr<engine_api::SidecarArena> arena =
        engine_api::MapSidecarArena(*reply, contract_.ArenaBytes());
    EXPECT_TRUE(arena.ok()) << arena.status();
    if (arena.ok()) engine.arena.emplace(*std::move(arena));
    return engine;
  }

  // Expect on the decode, then waits until the prefill holds the pre-allocation.
  void Expect(uint64_t room) {
    v1::EngineRequest expect;
    expect.mutable_expect()->set_room(room);
    expect.mutable_expect()->set_bootstrap_address(pair_->bootstrap());
    expect.mutable_expect()->set_destination_manifest(layout::SerializeManifest(dst_).value());
    ASSERT_TRUE(decode_.client->Call(expect).ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (true) {
      v1::EngineRequest poll;
      poll.mutable_poll()->add_rooms(room);
      absl::StatusOr<v1::EngineReply> reply = prefill_.client->Call(poll);
      ASSERT_TRUE(reply.ok()) << reply.status();
      if (reply->states(0).status() == v1::TRANSFER_POLL_BOOTSTRAPPED) return;
      ASSERT_LT(absl::Now(), deadline) << "room " << room << " was never pre-allocated";
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  absl::StatusOr<v1::EngineReply> LayersReady(uint64_t room, int64_t layers, bool manifest) {
    v1::EngineRequest request;
    request.mutable_layers_ready()->set_room(room);
    request.mutable_layers_ready()->set_layers(layers);
    if (manifest) {
      request.mutable_layers_ready()->set_source_manifest(layout::SerializeManifest(src_).value());
    }
    return prefill_.client->Call(request);
  }

  // Whether every byte the room copies for layers [begin, end) holds the source's bytes (or,
  // with `zero`, is still zero) in the decode's arena.
  bool Landed(plan::CopyPlan::LayerRange layers, bool zero = false) const {
    plan::CopyList copies;
    EXPECT_TRUE(plan_->ExpandLayers(src_, dst_, layers, true, copies).ok());
    EXPECT_FALSE(copies.empty());
    const uint8_t* from = prefill_.arena->bytes().data();
    const uint8_t* to = decode_.arena->bytes().data();
    for (const plan::Copy& c : copies) {
      for (uint64_t i = 0; i < c.length; ++i) {
        if (to[c.dst_offset + i] != (zero ? 0 : from[c.src_offset + i])) return false;
      }
    }
    return true;
  }

  bool AwaitLanded(plan::CopyPlan::LayerRange layers) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!Landed(layers)) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

  const layout::Contract contract_ = SmallContract();  // layer.0.k/v, layer.1.k/v
  const layout::Manifest src_ = RoomManifest(contract_, {1, 2, 3});
  const layout::Manifest dst_ = RoomManifest(contract_, {4, 7, 9});
  std::optional<plan::CopyPlan> plan_;
  std::unique_ptr<testing::SidecarPair> pair_;
  Engine prefill_, decode_;
};

TEST_F(LayerwiseTest, AFinalLayerLandsBeforeTheReadyAndTheSuccessWaitsForTheRest) {
  Expect(1);
  ASSERT_TRUE(Landed({0, 2}, /*zero=*/true));
  absl::StatusOr<v1::EngineReply> layer0 = LayersReady(1, 1, /*manifest=*/true);
  ASSERT_TRUE(layer0.ok()) << layer0.status();
  ASSERT_TRUE(AwaitLanded({0, 1})) << "layer 0 was said final but never landed";
  // Layer 1 is not final yet: nothing of it may be sent, and the room is not done.
  EXPECT_TRUE(Landed({1, 2}, /*zero=*/true)) << "a layer landed before the engine said final";
  EXPECT_FALSE(decode_.client->NextEvent(absl::Milliseconds(200)).has_value());

  v1::EngineRequest ready;
  ready.mutable_ready()->set_room(1);
  ready.mutable_ready()->set_bootstrap_token(9);  // the manifest of its LayersReady stands
  ASSERT_TRUE(prefill_.client->Call(ready).ok());
  std::optional<v1::RoomEvent> done = decode_.client->NextEvent(absl::Seconds(30));
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
  EXPECT_EQ(done->bootstrap_token(), 9);
  EXPECT_TRUE(Landed({0, 2})) << "Success before every layer landed";
  std::optional<v1::RoomEvent> sent = prefill_.client->NextEvent(absl::Seconds(30));
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->status(), v1::TRANSFER_POLL_SUCCESS);
  plan::CopyList room;
  ASSERT_TRUE(plan_->ExpandCoalesced(src_, dst_, room).ok());
  uint64_t bytes = 0;
  for (const plan::Copy& c : room) bytes += c.length;
  EXPECT_EQ(sent->bytes(), bytes);
}

// Failed means fenced between layers: the engine aborts after layer 0; both sides end Failed,
// and the decode's pages are released, proven (nothing of the room can land any more).
TEST_F(LayerwiseTest, AnAbortBetweenLayersFailsTheRoomOnBothSides) {
  Expect(2);
  ASSERT_TRUE(LayersReady(2, 1, /*manifest=*/true).ok());
  ASSERT_TRUE(AwaitLanded({0, 1}));
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(2);
  abort.mutable_abort()->set_reason("the engine gave the request up");
  ASSERT_TRUE(prefill_.client->Call(abort).ok());
  std::optional<v1::RoomEvent> prefill_end = prefill_.client->NextEvent(absl::Seconds(30));
  ASSERT_TRUE(prefill_end.has_value());
  EXPECT_EQ(prefill_end->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(prefill_end->pages(), v1::PAGES_REUSABLE);
  std::optional<v1::RoomEvent> decode_end = decode_.client->NextEvent(absl::Seconds(30));
  ASSERT_TRUE(decode_end.has_value());
  EXPECT_EQ(decode_end->status(), v1::TRANSFER_POLL_FAILED);
  if (decode_end->pages() == v1::PAGES_HELD) {  // the decode asks the prefill for its fence
    std::optional<v1::RoomEvent> released = decode_.client->NextEvent(absl::Seconds(30));
    ASSERT_TRUE(released.has_value());
    EXPECT_TRUE(released->pages_released());
    EXPECT_TRUE(released->pages_proven()) << released->reason();
  } else {
    EXPECT_EQ(decode_end->pages(), v1::PAGES_REUSABLE) << decode_end->reason();
  }
  // Later layers of the failed room are not sent.
  (void)LayersReady(2, 2, /*manifest=*/false);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(Landed({1, 2}, /*zero=*/true));
}

TEST_F(LayerwiseTest, BadCallsAreRefusedNamingTheRule) {
  absl::StatusOr<v1::EngineReply> no_manifest = LayersReady(3, 1, /*manifest=*/false);
  ASSERT_FALSE(no_manifest.ok());
  EXPECT_TRUE(absl::StrContains(no_manifest.status().message(),
                                "LayersReady room 3: room 3: the first LayersReady must give the "
                                "source manifest"))
      << no_manifest.status();
  v1::EngineRequest on_decode;
  on_decode.mutable_layers_ready()->set_room(3);
  on_decode.mutable_layers_ready()->set_layers(1);
  absl::StatusOr<v1::EngineReply> refused = decode_.client->Call(on_decode);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "this is a decode sidecar"))
      << refused.status();
}

// Where a layer-wise room starts: the engine's Begin (tokenspeed's prefill executor creates the
// room's sender before its forward pass). The room exists from then on, and its Bootstrapped
// comes once as an event with the decode's window, from which the engine builds the source
// manifest; Poll says the same.
class BeginTest : public LayerwiseTest {
 protected:
  std::optional<v1::RoomEvent> PrefillEvent() {
    return prefill_.client->NextEvent(absl::Seconds(30));
  }
  v1::RoomState PollPrefill(uint64_t room) {
    v1::EngineRequest poll;
    poll.mutable_poll()->add_rooms(room);
    absl::StatusOr<v1::EngineReply> reply = prefill_.client->Call(poll);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->states(0) : v1::RoomState();
  }
  absl::Status Begin(uint64_t room, Engine& engine) {
    v1::EngineRequest begin;
    begin.mutable_begin()->set_room(room);
    return engine.client->Call(begin).status();
  }
};

TEST_F(BeginTest, ABegunRoomIsBootstrappingThenBootstrappedWithTheDecodesWindowOnce) {
  ASSERT_TRUE(Begin(5, prefill_).ok());
  EXPECT_EQ(PollPrefill(5).status(), v1::TRANSFER_POLL_BOOTSTRAPPING);  // not "unknown room"
  Expect(5);
  std::optional<v1::RoomEvent> bootstrapped = PrefillEvent();
  ASSERT_TRUE(bootstrapped.has_value());
  EXPECT_EQ(bootstrapped->status(), v1::TRANSFER_POLL_BOOTSTRAPPED);
  ASSERT_EQ(bootstrapped->windows_size(), 1);
  EXPECT_EQ(bootstrapped->windows(0).prefix_len(), dst_.prefix_len);
  EXPECT_EQ(bootstrapped->windows(0).prompt_len(), dst_.prompt_len);
  EXPECT_EQ(bootstrapped->windows(0).decode_tp_rank(), 0u);
  EXPECT_FALSE(bootstrapped->windows(0).session().empty());
  const v1::RoomState polled = PollPrefill(5);
  EXPECT_EQ(polled.status(), v1::TRANSFER_POLL_BOOTSTRAPPED);
  ASSERT_EQ(polled.windows_size(), 1);
  EXPECT_EQ(polled.windows(0).prompt_len(), dst_.prompt_len);
  ASSERT_TRUE(Begin(5, prefill_).ok());  // again: changes nothing, announces nothing

  v1::EngineRequest ready;
  ready.mutable_ready()->set_room(5);
  ready.mutable_ready()->set_bootstrap_token(11);
  ready.mutable_ready()->set_source_manifest(layout::SerializeManifest(src_).value());
  ASSERT_TRUE(prefill_.client->Call(ready).ok());
  std::optional<v1::RoomEvent> done = decode_.client->NextEvent(absl::Seconds(30));
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
  EXPECT_TRUE(Landed({0, 2}));
  std::optional<v1::RoomEvent> sent = PrefillEvent();
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->status(), v1::TRANSFER_POLL_SUCCESS) << "a second Bootstrapped came";
}

TEST_F(BeginTest, ARoomPreallocatedBeforeItsBeginIsAnnouncedAtTheBegin) {
  Expect(6);  // the decode's pre-allocation is in before the engine has the request
  ASSERT_TRUE(Begin(6, prefill_).ok());
  std::optional<v1::RoomEvent> bootstrapped = PrefillEvent();
  ASSERT_TRUE(bootstrapped.has_value());
  EXPECT_EQ(bootstrapped->status(), v1::TRANSFER_POLL_BOOTSTRAPPED);
  EXPECT_EQ(bootstrapped->windows_size(), 1);
}

// An engine gives its block tables and the window instead of CachePD JSON: the sidecars build
// the canonical manifests (CACHEPD §5.2), and the room lands as with the engine's manifests.
TEST_F(BeginTest, ReadyAndExpectTakeBlockTablesInsteadOfManifests) {
  ASSERT_TRUE(Begin(8, prefill_).ok());
  v1::EngineRequest expect;
  expect.mutable_expect()->set_room(8);
  expect.mutable_expect()->set_bootstrap_address(pair_->bootstrap());
  v1::BlockTable* dst_table = expect.mutable_expect()->add_block_tables();
  for (int64_t id : {4, 7, 9}) dst_table->add_block_ids(id);
  expect.mutable_expect()->set_prompt_len(dst_.prompt_len);
  ASSERT_TRUE(decode_.client->Call(expect).ok());
  std::optional<v1::RoomEvent> bootstrapped = PrefillEvent();
  ASSERT_TRUE(bootstrapped.has_value());
  ASSERT_EQ(bootstrapped->status(), v1::TRANSFER_POLL_BOOTSTRAPPED);
  ASSERT_EQ(bootstrapped->windows_size(), 1);
  EXPECT_EQ(bootstrapped->windows(0).prompt_len(), dst_.prompt_len);

  v1::EngineRequest ready;
  ready.mutable_ready()->set_room(8);
  v1::BlockTable* src_table = ready.mutable_ready()->add_block_tables();
  for (int64_t id : {1, 2, 3}) src_table->add_block_ids(id);
  ready.mutable_ready()->set_prefix_len(bootstrapped->windows(0).prefix_len());
  ready.mutable_ready()->set_prompt_len(bootstrapped->windows(0).prompt_len());
  // Both ways at once is refused, naming the rule; a block id outside the arena, naming it.
  v1::EngineRequest both = ready;
  both.mutable_ready()->set_source_manifest(layout::SerializeManifest(src_).value());
  absl::Status refused = prefill_.client->Call(both).status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "give source_manifest or block_tables"))
      << refused;
  v1::EngineRequest outside = ready;
  outside.mutable_ready()->mutable_block_tables(0)->set_block_ids(0, 1 << 30);
  refused = prefill_.client->Call(outside).status();
  EXPECT_TRUE(absl::StrContains(refused.message(), "Ready room 8: block_tables")) << refused;

  ASSERT_TRUE(prefill_.client->Call(ready).ok());
  std::optional<v1::RoomEvent> done = decode_.client->NextEvent(absl::Seconds(30));
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
  EXPECT_TRUE(Landed({0, 2}));
}

TEST_F(BeginTest, BeginOnADecodeIsRefusedNamingTheRule) {
  const absl::Status refused = Begin(7, decode_);
  EXPECT_TRUE(absl::StrContains(refused.message(), "Begin room 7: this is a decode sidecar"))
      << refused;
}

}  // namespace
}  // namespace kvrail::sidecar
