// Both roles together: four decode ranks (D = 4) and two prefill ranks (P = 2) of the fan-out
// scenario exchange their real frames through an in-memory network that delivers each
// message to the endpoint it names, and one room goes from Bootstrapping to Success on every
// rank with the prefill's token and speculative ids (CACHEPD §1.3).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/session/decode_rooms.h"
#include "control/session/prefill_rooms.h"
#include "control/session/test_peers.h"
#include "control/session/test_transfers.h"

namespace kvrail::session {
namespace {

using kvrail::session::testing::DecodeContract;
using kvrail::session::testing::DecodeManifest;
using kvrail::session::testing::PrefillContract;
using kvrail::session::testing::ReplyEndpointOf;
using kvrail::session::testing::SessionOf;
using kvrail::session::testing::SourceManifest;

constexpr int kPrefillTp = 2;
constexpr int kDecodeTp = 4;
constexpr char kBootstrap[] = "10.0.0.1:8998";
const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

std::string PrefillEndpoint(int p) { return absl::StrCat("tcp://10.0.0.1:", 17500 + p); }

class Cluster {
 public:
  Cluster() {
    for (int p = 0; p < kPrefillTp; ++p) {
      PrefillIdentity identity;
      identity.prefill_tp_size = kPrefillTp;
      identity.prefill_tp_rank = p;
      identity.contract = PrefillContract();
      prefill_.push_back(*PrefillRooms::Create(identity));
    }
    for (int d = 0; d < kDecodeTp; ++d) {
      DecodeIdentity identity;
      identity.endpoint = absl::StrCat("10.1.0.", d + 1);
      identity.port = static_cast<uint16_t>(17000 + d);
      identity.session_id = SessionOf(d);
      identity.arena_base = 0x7e0000000000;
      identity.contract = DecodeContract();
      identity.decode_tp_size = kDecodeTp;
      identity.decode_tp_rank = d;
      decode_.push_back(*DecodeRooms::Create(identity));
    }
  }

  PrefillRooms& prefill(int p) { return prefill_[p]; }
  DecodeRooms& decode(int d) { return decode_[d]; }
  const std::vector<RoomEvent>& decode_events(int d) { return decode_events_[d]; }
  std::vector<TransferWork>& transfers() { return transfers_; }

  template <typename Output>
  void Post(const Output& out) {
    for (const OutboundMessage& m : out.messages) queue_.push_back(m);
  }

  // Delivers queued messages, and those they cause, until the network is quiet.
  void Deliver() {
    while (!queue_.empty()) {
      OutboundMessage m = std::move(queue_.front());
      queue_.pop_front();
      bool delivered = false;
      for (int p = 0; p < kPrefillTp; ++p) {
        if (m.endpoint != PrefillEndpoint(p)) continue;
        PrefillOutput out = prefill_[p].OnMessage(m.frames, kT0);
        EXPECT_TRUE(out.rejected.ok()) << out.rejected;
        Post(out);
        for (TransferWork& work : out.transfers) transfers_.push_back(std::move(work));
        delivered = true;
      }
      for (int d = 0; d < kDecodeTp; ++d) {
        if (m.endpoint != ReplyEndpointOf(d)) continue;
        DecodeOutput out = decode_[d].OnMessage(m.frames, kT0);
        EXPECT_TRUE(out.rejected.ok()) << out.rejected;
        for (RoomEvent& e : out.events) decode_events_[d].push_back(std::move(e));
        delivered = true;
      }
      EXPECT_TRUE(delivered) << "nobody listens at " << m.endpoint;
    }
  }

 private:
  std::vector<PrefillRooms> prefill_;
  std::vector<DecodeRooms> decode_;
  std::map<int, std::vector<RoomEvent>> decode_events_;
  std::vector<TransferWork> transfers_;
  std::deque<OutboundMessage> queue_;
};

TEST(RoomsEndToEndTest, OneRoomSucceedsOnEveryRankWithThePrefillsToken) {
  Cluster cluster;
  absl::StatusOr<plan::Planner> planner =
      plan::Planner::Create(kPrefillTp, kDecodeTp, PrefillContract(), DecodeContract());
  ASSERT_TRUE(planner.ok()) << planner.status();

  // Decode side: route, registration (once per peer set), pre-allocation.
  for (int d = 0; d < kDecodeTp; ++d) {
    DecodeRooms& rooms = cluster.decode(d);
    ASSERT_TRUE(rooms.BeginRoom(42, kBootstrap, kT0).ok());
    absl::StatusOr<plan::DecodeTargets> targets = planner->TargetsFor(d);
    ASSERT_TRUE(targets.ok()) << targets.status();
    RoomRoute route;
    route.targets = *targets;
    for (int p : targets->target_tp_ranks) route.endpoints.push_back({p, PrefillEndpoint(p)});
    absl::StatusOr<DecodeOutput> routed = rooms.OnRoute(42, route, kT0);
    ASSERT_TRUE(routed.ok()) << routed.status();
    EXPECT_EQ(routed->messages.size(), targets->target_tp_ranks.size());
    cluster.Post(*routed);
    absl::StatusOr<DecodeOutput> allocated = rooms.OnAllocated(42, DecodeManifest(), kT0);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    cluster.Post(*allocated);
  }
  cluster.Deliver();
  for (int p = 0; p < kPrefillTp; ++p) {
    EXPECT_EQ(cluster.prefill(p).State(42), TransferPoll::kBootstrapped) << "prefill " << p;
  }

  // Prefill side: the engine begins and finishes the room; the copies are expanded as the
  // transfer layer would, then reported landed.
  for (int p = 0; p < kPrefillTp; ++p) {
    ASSERT_TRUE(cluster.prefill(p).BeginRoom(42, kT0).ok());
    RoomReady ready;
    ready.source_manifest = SourceManifest();
    ready.bootstrap_token = 151643;
    ready.spec_candidate_ids = std::vector<int32_t>{5, 6};
    absl::StatusOr<PrefillOutput> out = cluster.prefill(p).Ready(42, ready, kT0);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->transfers.size(), 1u) << "prefill " << p;
    for (const TransferDestination& d : out->transfers[0].destinations) {
      plan::CopyList copies;
      ASSERT_TRUE(
          d.peer->copy_plan->Expand(*out->transfers[0].source_manifest, *d.manifest, copies).ok());
      uint64_t bytes = 0;
      for (const plan::Copy& c : copies) bytes += c.length;
      EXPECT_EQ(bytes, d.bytes);
    }
    PrefillOutput posted;
    (void)testing::Post(cluster.prefill(p), out->transfers[0], kT0, posted);
    absl::StatusOr<PrefillOutput> done = testing::LandAll(cluster.prefill(p), 42, kT0);
    ASSERT_TRUE(done.ok()) << done.status();
    cluster.Post(*done);
  }
  cluster.Deliver();

  for (int d = 0; d < kDecodeTp; ++d) {
    SCOPED_TRACE(absl::StrCat("decode ", d));
    EXPECT_EQ(cluster.decode(d).State(42), TransferPoll::kSuccess);
    ASSERT_FALSE(cluster.decode_events(d).empty());
    const RoomEvent& last = cluster.decode_events(d).back();
    EXPECT_EQ(last.state, TransferPoll::kSuccess);
    EXPECT_EQ(last.bootstrap_token, 151643);
    EXPECT_EQ(last.spec_candidate_ids, (std::vector<int32_t>{5, 6}));
  }

  // A second room reuses the registrations: the decode ranks send pre-allocations only.
  for (int d = 0; d < kDecodeTp; ++d) {
    ASSERT_TRUE(cluster.decode(d).BeginRoom(43, kBootstrap, kT0).ok());
    RoomRoute route;
    route.targets = *planner->TargetsFor(d);
    for (int p : route.targets.target_tp_ranks) route.endpoints.push_back({p, PrefillEndpoint(p)});
    EXPECT_TRUE(cluster.decode(d).OnRoute(43, route, kT0)->messages.empty());
  }
}

}  // namespace
}  // namespace kvrail::session
