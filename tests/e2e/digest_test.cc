// --verify-digest at a decode sidecar in this process (docs/SECURITY.md, "Digests"), with kvrail's
// bootstrap server in this process too, facing a fake prefill
// rank that writes the room straight into the decode's arena (the test owns it, POSIX shared
// memory) and then sends what a kvrail prefill sends: [sender proof, room digest], [sender
// proof, Success]. The fake can therefore corrupt a landed byte after computing the digest,
// which no real data plane would do on purpose. The fake registers with kvrail's bootstrap
// server, so the decode (--sender-proofs auto) takes the node as kvrail's; a tokenspeed-shaped
// peer is the same fake under --sender-proofs off, sending CachePD's frames alone.
#include "control/wire/digest.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/process/subprocess.h"
#include "control/bootstrap/server.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/room_digest.h"
#include "control/sidecar/session_key.h"
#include "control/sidecar/sidecar.h"
#include "control/wire/fence.h"
#include "control/wire/preallocation.h"
#include "control/wire/proof.h"
#include "control/wire/status.h"
#include "engine/memory/arena.h"
#include "tests/e2e/sidecar_peer.h"

namespace kvrail {
namespace {

using e2e::RoomManifest;
using e2e::SmallContract;

class DigestTest : public ::testing::Test {
 protected:
  // Starts kvrail's bootstrap server, registers the fake prefill rank with it, starts the
  // decode sidecar (--verify-digest, with `sender_proofs`) and attaches the test's arena to it.
  void Start(sidecar::SenderProofs sender_proofs) {
    ASSERT_TRUE(bootstrap_.Start("127.0.0.1", 0).ok());
    bootstrap_address_ = absl::StrCat("127.0.0.1:", bootstrap_.port());
    ASSERT_TRUE(e2e::RegisterFakePrefillRank(bootstrap_.port(), pull_, contract_));
    sidecar::SidecarOptions options;
    options.role = sidecar::Role::kDecode;
    options.engine_endpoint = "tcp://127.0.0.1:0";
    options.backend = "loopback";  // the fake writes the arena itself
    options.tls.clear();
    options.lanes = 1;
    options.fence_wait = absl::Seconds(20);
    options.verify_digest = true;
    options.sender_proofs = sender_proofs;
    absl::StatusOr<std::unique_ptr<sidecar::Sidecar>> started = sidecar::Sidecar::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    sidecar_ = *std::move(started);
    static int arenas = 0;  // one per test of this process
    const std::string arena_name =
        absl::StrCat("/kvrail-digest-", process::ProcessTag(), "-", ++arenas);
    arena_ = Arena::CreateShared(arena_name, contract_.ArenaBytes()).value();
    engine_ = engine_api::EngineApiClient::Connect(sidecar_->engine_endpoint()).value();
    v1::EngineRequest attach;
    attach.mutable_attach()->set_shm_name(arena_name);
    attach.mutable_attach()->set_contract(layout::SerializeContract(contract_).value());
    ASSERT_TRUE(engine_->Call(attach).ok());
  }

  void TearDown() override {
    engine_.reset();
    if (sidecar_) sidecar_->Stop();
    bootstrap_.Stop();
  }

  std::vector<std::string> Receive() { return e2e::Receive(pull_); }

  void Send(const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> parts;
    for (const std::string& f : frames) parts.push_back(zmq::buffer(f));
    ASSERT_TRUE(zmq::send_multipart(push_, parts).has_value());
  }

  // Sends `frames` behind a sender proof keyed with the decode's session key, as a kvrail
  // prefill does to a keyed session.
  void SendProven(const std::vector<std::string>& frames, uint64_t room) {
    Send(wire::BuildSenderProof({room, 0, sidecar::SessionKey::Tag(key_, frames)}).value());
    Send(frames);
  }

  // The engine's Expect; then reads the decode's messages up to the room's pre-allocation
  // (its registration first, once), keeping its session key from the owner proof.
  void Expect(uint64_t room, const layout::Manifest& manifest) {
    v1::EngineRequest expect;
    expect.mutable_expect()->set_room(room);
    expect.mutable_expect()->set_bootstrap_address(bootstrap_address_);
    expect.mutable_expect()->set_destination_manifest(layout::SerializeManifest(manifest).value());
    ASSERT_TRUE(engine_->Call(expect).ok());
    while (true) {
      const std::vector<std::string> frames = Receive();
      ASSERT_FALSE(frames.empty()) << "no pre-allocation of room " << room;
      if (wire::IsOwnerProof(frames)) key_ = wire::ParseOwnerProof(frames).value().key;
      if (frames.size() == 8 && !connected_) {  // the registration: where statuses go
        push_.set(zmq::sockopt::linger, 2000);
        push_.connect(absl::StrCat("tcp://", frames[1], ":", frames[2]));
        connected_ = true;
      }
      if (wire::ParsePreallocation(frames).ok()) return;
    }
  }

  // Writes the room's bytes into the decode's arena, from patterned source pages 1..n, as the
  // data plane would; returns the room digest the prefill computes over its source.
  uint64_t Land(const layout::Manifest& destination) {
    std::vector<int64_t> source_blocks;
    for (size_t i = 0; i < destination.groups[0].block_ids.size(); ++i) {
      source_blocks.push_back(static_cast<int64_t>(i) + 1);
    }
    const layout::Manifest source = RoomManifest(contract_, source_blocks);
    std::vector<uint8_t> src(contract_.ArenaBytes());
    std::mt19937 random(11);
    for (uint8_t& b : src) b = static_cast<uint8_t>(random());
    const plan::CopyPlan copy_plan = plan::CopyPlan::Bind(contract_, contract_, {}).value();
    plan::CopyList copies;
    EXPECT_TRUE(copy_plan.ExpandCoalesced(source, destination, copies).ok());
    for (const plan::Copy& c : copies) {
      std::memcpy(arena_->data() + c.dst_offset, src.data() + c.src_offset, c.length);
    }
    first_landed_ = copies[0].dst_offset;
    return plan::RoomDigest(copies, plan::DigestSide::kSource, src).value();
  }

  std::vector<std::string> Success(uint64_t room) {
    return wire::BuildStatus({room, 5, 0, 7, std::nullopt}, wire::StatusForm::kSnapshot).value();
  }

  v1::SidecarStats Stats() {
    v1::EngineRequest request;
    request.mutable_stats();
    return engine_->Call(request).value().stats();
  }

  const layout::Contract contract_ = SmallContract();
  bootstrap::BootstrapServer bootstrap_;
  std::string bootstrap_address_;
  std::unique_ptr<sidecar::Sidecar> sidecar_;
  std::optional<Arena> arena_;
  std::unique_ptr<engine_api::EngineApiClient> engine_;
  zmq::context_t context_;
  zmq::socket_t pull_{context_, zmq::socket_type::pull};
  zmq::socket_t push_{context_, zmq::socket_type::push};
  bool connected_ = false;
  std::string key_;
  uint64_t first_landed_ = 0;
};

TEST_F(DigestTest, ARoomWhoseDigestMatchesTheLandedBytesSucceeds) {
  ASSERT_NO_FATAL_FAILURE(Start(sidecar::SenderProofs::kAuto));
  const layout::Manifest manifest = RoomManifest(contract_, {3, 5, 8});
  Expect(5, manifest);
  ASSERT_FALSE(key_.empty());
  const uint64_t digest = Land(manifest);
  SendProven(wire::BuildRoomDigest({5, 0, digest}).value(), 5);
  SendProven(Success(5), 5);
  std::optional<v1::RoomEvent> event = engine_->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->status(), v1::TRANSFER_POLL_SUCCESS) << event->reason();
  EXPECT_EQ(Stats().room_digests(), 1u);
}

// One byte of the landed room changes after the prefill computed its digest: the room fails
// naming the rank, both digests and the flag; its pages are held until the prefill rank answers
// the fence request, then released, proven.
TEST_F(DigestTest, ACorruptedLandedByteFailsTheRoomNamingBothDigestsAndReleasesItsPages) {
  ASSERT_NO_FATAL_FAILURE(Start(sidecar::SenderProofs::kAuto));
  const layout::Manifest manifest = RoomManifest(contract_, {3, 5, 8});
  Expect(6, manifest);
  const uint64_t digest = Land(manifest);
  arena_->data()[first_landed_ + 100] ^= 0x20;
  SendProven(wire::BuildRoomDigest({6, 0, digest}).value(), 6);
  SendProven(Success(6), 6);
  std::optional<v1::RoomEvent> failed = engine_->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_TRUE(absl::StrContains(
      failed->reason(), absl::StrCat("--verify-digest: prefill rank 0 sent ",
                                     plan::FormatDigest(digest), ", the landed bytes hash to 0x")))
      << failed->reason();
  EXPECT_EQ(failed->pages(), v1::PAGES_HELD);  // rank 0 has not reported Success: fence it
  // The decode asks the prefill rank to fence the room; the fake answers as a kvrail prefill.
  std::vector<std::string> request;
  do {
    request = Receive();
    ASSERT_FALSE(request.empty()) << "no fence request";
  } while (!wire::IsFenceRequest(request));
  SendProven(wire::BuildFencedAnswer({6, 0, true}).value(), 6);
  std::optional<v1::RoomEvent> released = engine_->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(released.has_value());
  EXPECT_TRUE(released->pages_released());
  EXPECT_TRUE(released->pages_proven());
  EXPECT_EQ(Stats().room_digests_failed(), 1u);
}

// A kvrail node's rank (the bootstrap says kvrail; its statuses come proven) that sends
// Success without a digest: its prefill runs without --verify-digest. Refused, naming the flag.
TEST_F(DigestTest, ASuccessWithoutADigestFromAKvrailNodeFailsTheRoomNamingTheFlag) {
  ASSERT_NO_FATAL_FAILURE(Start(sidecar::SenderProofs::kAuto));
  const layout::Manifest manifest = RoomManifest(contract_, {2});
  Expect(7, manifest);
  Land(manifest);
  SendProven(Success(7), 7);
  std::optional<v1::RoomEvent> failed = engine_->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_TRUE(absl::StrContains(failed->reason(),
                                "--verify-digest: prefill rank 0 sent Success without a room "
                                "digest, and its node is kvrail's"))
      << failed->reason();
}

// A tokenspeed prefill sends CachePD's frames alone. With --sender-proofs off (the setting for
// nodes that hold tokenspeed ranks, docs/SECURITY.md) its Success counts as CachePD says, flag
// or not: nothing to check it against.
TEST_F(DigestTest, ATokenspeedShapedPrefillsSuccessKeepsCachePdsRule) {
  ASSERT_NO_FATAL_FAILURE(Start(sidecar::SenderProofs::kOff));
  const layout::Manifest manifest = RoomManifest(contract_, {4, 6});
  Expect(8, manifest);
  Land(manifest);
  Send(Success(8));
  std::optional<v1::RoomEvent> event = engine_->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->status(), v1::TRANSFER_POLL_SUCCESS) << event->reason();
  const v1::SidecarStats stats = Stats();
  EXPECT_EQ(stats.room_digests(), 0u);
  EXPECT_EQ(stats.room_digests_failed(), 0u);
}

// A digest that came is checked even from a node that need not send one.
TEST_F(DigestTest, AWrongDigestFailsTheRoomEvenWhereNoneIsRequired) {
  ASSERT_NO_FATAL_FAILURE(Start(sidecar::SenderProofs::kOff));
  const layout::Manifest manifest = RoomManifest(contract_, {4, 6});
  Expect(9, manifest);
  const uint64_t digest = Land(manifest);
  Send(wire::BuildRoomDigest({9, 0, digest ^ 1}).value());
  Send(Success(9));
  std::optional<v1::RoomEvent> event = engine_->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_TRUE(
      absl::StrContains(event->reason(), "the landed bytes hash to " + plan::FormatDigest(digest)))
      << event->reason();
}

}  // namespace
}  // namespace kvrail
