// Two hosts on one machine (root only): the prefill node (bootstrap and prefill sidecar) in one
// network namespace, the decode sidecar in another, joined by a veth pair, over UCX tcp. The
// link is set down in the middle of a room and up again: the room fails on the prefill within
// its deadline plus the fence bound, the decode hears Failed once the link is back and is told
// its pages are free only as far as the fence could prove, and a new room lands over the healed
// link. The fence suite (fence_suite.h) runs here too, over the veth pair.
#include "cluster/netns.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/chaos/deployment.h"
#include "tests/chaos/fence_suite.h"

namespace kvrail::chaos {
namespace {

int Sh(const std::string& command) { return std::system(command.c_str()); }

// The prefill node in one namespace, a decode in the other; the test cuts the link between.
class NetnsFaultTest : public ::testing::TestWithParam<const char*> {
 protected:
  void Start(std::vector<std::string> prefill_args, std::vector<std::string> decode_args) {
    ASSERT_EQ(geteuid(), 0u) << "needs root (network namespaces); CI runs it as root";
    absl::StatusOr<cluster::NetnsPair> pair = cluster::NetnsPair::Create();
    ASSERT_TRUE(pair.ok()) << pair.status();
    pair_ = std::make_unique<cluster::NetnsPair>(*std::move(pair));
    DeploymentOptions options;
    options.pages = 129;
    PlaceInNamespaces(*pair_, options, GetParam());
    options.prefill_args = std::move(prefill_args);
    options.decode_args = std::move(decode_args);
    auto started = Deployment::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    deployment_ = *std::move(started);
  }

  // Sets the decode's end of the veth pair up or down.
  void Link(bool up) {
    ASSERT_EQ(Sh(absl::StrCat("ip -n ", pair_->target().netns, " link set ", pair_->target().device,
                              up ? " up" : " down")),
              0);
  }

  // Starts `room` and sets the link down 30 ms later (`down`): the prefill's event of the room,
  // once it failed. nullopt when the test cannot go on: a failure, or the room landed before
  // the link went down (skipped_).
  std::optional<v1::RoomEvent> CutOffMidRoom(uint64_t room, const layout::Manifest& manifest,
                                             absl::Time& down) {
    Deployment& d = *deployment_;
    EXPECT_TRUE(d.Expect(0, room, manifest).ok());
    EXPECT_TRUE(d.Ready(room, manifest).ok());
    absl::SleepFor(absl::Milliseconds(30));
    Link(false);
    down = absl::Now();
    absl::StatusOr<v1::RoomEvent> failed = d.Event(d.prefill(), room, absl::Seconds(30));
    EXPECT_TRUE(failed.ok()) << failed.status();
    if (!failed.ok() || HasFailure()) return std::nullopt;
    if (failed->status() == v1::TRANSFER_POLL_SUCCESS) {
      skipped_ = true;
      return std::nullopt;
    }
    return *std::move(failed);
  }

  // The link is back: a decode restarted (a new session: the old one is quarantined or
  // dropped) is served.
  void ExpectARestartedDecodeServed(uint64_t room) {
    ASSERT_TRUE(deployment_->RestartDecode(0).ok());
    const absl::Status moved = deployment_->MoveRoom(0, room, deployment_->Blocks(1, 8));
    EXPECT_TRUE(moved.ok()) << moved;
  }

  bool skipped_ = false;  // CutOffMidRoom: the room landed before the link went down
  std::unique_ptr<cluster::NetnsPair> pair_;  // outlives the deployment in it
  std::unique_ptr<Deployment> deployment_;
};

TEST_P(NetnsFaultTest, ALinkDownMidRoomFailsItWithinTheDeadlineAndANewRoomLandsOnceItIsUp) {
  Start({"--transfer-deadline", "2", "--fence-timeout", "1", "--heartbeat-interval", "2"},
        // Generous on the decode: the link is down for a while, and the bootstrap's heartbeat
        // must not declare the prefill dead meanwhile.
        {"--heartbeat-interval", "5", "--heartbeat-failures", "5", "--fence-wait", "10"});
  if (HasFatalFailure()) return;
  Deployment& d = *deployment_;
  const layout::Manifest manifest = d.Blocks(1, 128);
  absl::Time down;
  std::optional<v1::RoomEvent> failed = CutOffMidRoom(1, manifest, down);
  if (skipped_) GTEST_SKIP() << "the room landed before the link went down";
  if (!failed) return;
  const absl::Duration took = absl::Now() - down;
  EXPECT_LT(took, absl::Seconds(2 + 1 + 3)) << failed->reason();
  std::printf("link down mid-room: prefill room failed after %s: %s\n",
              absl::FormatDuration(took).c_str(), failed->reason().c_str());
  absl::SleepFor(absl::Seconds(1));
  Link(true);
  absl::StatusOr<v1::RoomEvent> freed = d.PagesFree(0, 1, absl::Seconds(60));
  ASSERT_TRUE(freed.ok()) << freed.status();
  const uint64_t overwritten = d.OverwrittenWithin(0, absl::Milliseconds(700));
  std::printf(
      "link up: decode pages freed %s after it came back (%s: %s), %llu bytes "
      "overwritten after\n",
      absl::FormatDuration(absl::Now() - down).c_str(),
      freed->pages_proven() ? "proven" : "unproven", freed->reason().c_str(),
      static_cast<unsigned long long>(overwritten));
  if (freed->pages_proven()) {
    EXPECT_EQ(overwritten, 0u);
  }
  // The old session is quarantined for a while (CACHEPD §7.4).
  ExpectARestartedDecodeServed(2);
}

// A decode host cut off for longer than --registration-ttl: the prefill drops its session (the
// registration, data-plane link and PUSH socket), failing its room with a reason naming the
// rule, instead of keeping it for ever; a decode started once the link is back is served.
TEST_P(NetnsFaultTest, ASessionCutOffPastTheRegistrationTtlIsDropped) {
  Start({"--registration-ttl", "3", "--heartbeat-interval", "2", "--fence-timeout", "1"},
        {"--heartbeat-interval", "5", "--heartbeat-failures", "5"});
  if (HasFatalFailure()) return;
  Deployment& d = *deployment_;
  absl::StatusOr<v1::SidecarStats> before = d.Stats(d.prefill());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->registrations(), 1u);
  const layout::Manifest manifest = d.Blocks(1, 128);
  absl::Time down;
  std::optional<v1::RoomEvent> failed = CutOffMidRoom(1, manifest, down);
  if (skipped_) GTEST_SKIP() << "the room landed before the link went down";
  if (!failed) return;
  // Over UCX tcp the writes wait in the kernel's retransmissions until the TTL drops the session;
  // RC verbs give up sooner, after the QP's retry budget, naming it. Either way the session is
  // dropped once the TTL passes (below).
  EXPECT_NE(failed->reason().find(std::string(GetParam()) == "verbs" ? "IBV_WC_RETRY_EXC_ERR"
                                                                     : "--registration-ttl"),
            std::string::npos)
      << failed->reason();
  std::printf("decode cut off: its session dropped %s after the link went down: %s\n",
              absl::FormatDuration(absl::Now() - down).c_str(), failed->reason().c_str());
  // Its data plane goes once the room's fence is done (just after its event); its PUSH socket,
  // which carried the room's late Failed, once it has been unused for 10 s.
  absl::StatusOr<v1::SidecarStats> after;
  for (int i = 0; i < 300; ++i) {
    after = d.Stats(d.prefill());
    ASSERT_TRUE(after.ok()) << after.status();
    if (after->outbox_peers() == 0 && after->data_plane_peers() == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(after->registrations(), 0u);
  EXPECT_EQ(after->outbox_peers(), 0u);
  EXPECT_EQ(after->data_plane_peers(), 0u);
  Link(true);
  ExpectARestartedDecodeServed(2);
}

// A second veth pair between `pair`'s namespaces (10.214.<n>.1 and .2), for a second rail;
// removed with the namespaces.
struct SecondLink {
  std::string initiator_device, target_device;
};
absl::StatusOr<SecondLink> AddSecondLink(const cluster::NetnsPair& pair) {
  const int n = static_cast<int>(getpid() % 200) + 20;
  SecondLink link{absl::StrCat("kvr2a", getpid() % 100000),
                  absl::StrCat("kvr2b", getpid() % 100000)};
  const std::string& a = pair.initiator().netns;
  const std::string& b = pair.target().netns;
  for (const std::string& step : {
           absl::StrCat("ip link add ", link.initiator_device, " type veth peer name ",
                        link.target_device),
           absl::StrCat("ip link set ", link.initiator_device, " netns ", a),
           absl::StrCat("ip link set ", link.target_device, " netns ", b),
           absl::StrCat("ip -n ", a, " addr add 10.214.", n, ".1/24 dev ", link.initiator_device),
           absl::StrCat("ip -n ", b, " addr add 10.214.", n, ".2/24 dev ", link.target_device),
           absl::StrCat("ip -n ", a, " link set ", link.initiator_device, " up"),
           absl::StrCat("ip -n ", b, " link set ", link.target_device, " up"),
       }) {
    if (Sh(step) != 0) return absl::InternalError(absl::StrCat("`", step, "` failed"));
  }
  return link;
}

// Two rails, as on a node with two NICs: each sidecar's verbs backend has softverbs0 on the
// first veth pair and softverbs1 on a second, a lane on each. The second link is cut while a
// 1 GiB room is in flight. Its batches on that rail fail with IBV_WC_RETRY_EXC_ERR, move to
// the other rail and land: the room succeeds, byte-exact on the decode, the failover is
// counted, and the next room lands on the rail that is left (README: "a rail whose path fails
// costs no room, only its retry").
TEST(MultiRailTest, ARailCutMidRoomCostsNoRoomOnlyItsRetry) {
  ASSERT_EQ(geteuid(), 0u) << "needs root (network namespaces); CI runs it as root";
  absl::StatusOr<cluster::NetnsPair> pair = cluster::NetnsPair::Create();
  ASSERT_TRUE(pair.ok()) << pair.status();
  absl::StatusOr<SecondLink> second = AddSecondLink(*pair);
  ASSERT_TRUE(second.ok()) << second.status();
  DeploymentOptions options;
  options.pages = 513;  // a 1 GiB room: it lasts long enough for the cut to come mid-room
  PlaceInNamespaces(*pair, options, "verbs");
  options.net_devices += "," + second->initiator_device;
  options.decode_net_devices += "," + second->target_device;
  options.prefill_args = {"--lanes", "2", "--transfer-deadline", "30"};
  options.decode_args = {"--lanes", "2", "--heartbeat-interval", "5", "--heartbeat-failures", "5"};
  absl::StatusOr<std::unique_ptr<Deployment>> started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  // A first small room connects the QPs on both rails, so that the big one starts writing at
  // once.
  const absl::Status warm = d.MoveRoom(0, 3, d.Blocks(1, 8));
  ASSERT_TRUE(warm.ok()) << warm;
  const layout::Manifest manifest = d.Blocks(1, 512);
  ASSERT_TRUE(d.Expect(0, 1, manifest).ok());
  ASSERT_TRUE(d.Ready(1, manifest).ok());
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(Sh(absl::StrCat("ip -n ", pair->target().netns, " link set ", second->target_device,
                            " down")),
            0);
  const absl::Time down = absl::Now();
  absl::StatusOr<v1::RoomEvent> sent = d.Event(d.prefill(), 1, absl::Seconds(60));
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->status(), v1::TRANSFER_POLL_SUCCESS) << sent->reason();
  absl::StatusOr<v1::SidecarStats> stats = d.Stats(d.prefill());
  ASSERT_TRUE(stats.ok()) << stats.status();
  if (sent->status() == v1::TRANSFER_POLL_SUCCESS && stats->rail_failovers() == 0) {
    GTEST_SKIP() << "the second rail's part of the room landed before its link went down";
  }
  EXPECT_GE(stats->rail_failovers(), 1u);
  absl::StatusOr<v1::RoomEvent> landed = d.Event(d.decode(0), 1, absl::Seconds(30));
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ(landed->status(), v1::TRANSFER_POLL_SUCCESS) << landed->reason();
  EXPECT_TRUE(d.Landed(0, manifest)) << "Success, but the decode's pages differ";
  std::printf("rail cut mid-room: the room landed %s after the cut, %llu batch(es) failed over\n",
              absl::FormatDuration(absl::Now() - down).c_str(),
              static_cast<unsigned long long>(stats->rail_failovers()));
  // The next room goes over the rail that is left.
  const absl::Status next = d.MoveRoom(0, 2, d.Blocks(1, 8));
  EXPECT_TRUE(next.ok()) << next;
}

// "tcp": UCX tcp over the veth; "verbs": the verbs backend, its software rails on the veth ends.
INSTANTIATE_TEST_SUITE_P(Links, NetnsFaultTest, ::testing::Values("tcp", "verbs"),
                         [](const auto& info) { return std::string(info.param); });

// Failed means fenced between two hosts too: the fence suite over the veth pair.
INSTANTIATE_TEST_SUITE_P(Netns, FenceTest, ::testing::Values("netns", "netns_verbs"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvrail::chaos
