// Faults on real processes (docs/RELIABILITY.md): a prefill killed mid-room, and killed or shut
// down while its decode is stopped; a decode stopped past its room's deadline and resumed; the
// bootstrap server restarted mid-run; an engine that restarts. Each asserts that the rooms the
// fault touches fail within a bound with a reason, that the others succeed, and that no byte lands
// in pages the engine was told are free. (A decode stopped or gone beside a healthy one, which
// compares latencies: isolation_test.)
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/base/error.h"
#include "tests/chaos/deployment.h"

namespace kvrail::chaos {
namespace {

class FaultsTest : public ::testing::TestWithParam<const char*> {};

// A prefill and one decode over `tls` (TwoDecodes' quick deadlines and probes), room 1 of 128
// blocks (256 MiB) expected at the decode and ready at the prefill: its writes under way.
absl::StatusOr<std::unique_ptr<Deployment>> StartLargeRoom(const char* tls) {
  DeploymentOptions options = TwoDecodes(tls);
  options.decodes = 1;
  options.pages = 129;
  auto started = Deployment::Start(options);
  if (!started.ok()) return started.status();
  Deployment& d = **started;
  const layout::Manifest manifest = d.Blocks(1, 128);
  KVRAIL_RETURN_IF_ERROR(d.Expect(0, 1, manifest));
  KVRAIL_RETURN_IF_ERROR(d.Ready(1, manifest));
  return started;
}

// A prefill sidecar killed while it writes: the decode sidecar survives, fails the room within
// seconds (its probe of the prefill's socket, not the bootstrap's heartbeat: the bootstrap
// server lives on), and serves a new prefill afterwards.
TEST_P(FaultsTest, APrefillKilledMidRoomLeavesItsDecodeRunningAndFailsTheRoomInSeconds) {
  auto started = StartLargeRoom(GetParam());
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  absl::SleepFor(absl::Milliseconds(30));
  d.prefill().sidecar->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  absl::StatusOr<v1::RoomEvent> failed = d.Event(d.decode(0), 1, absl::Seconds(30));
  ASSERT_TRUE(failed.ok()) << failed.status();
  const absl::Duration took = absl::Now() - killed;
  if (failed->status() == v1::TRANSFER_POLL_SUCCESS) {
    GTEST_SKIP() << "the room landed before the kill";
  }
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_LT(took, absl::Seconds(10)) << failed->reason();
  std::printf("[%s] prefill killed mid-room: decode room failed after %s: %s\n", GetParam(),
              absl::FormatDuration(took).c_str(), failed->reason().c_str());
  // The decode sidecar is alive.
  EXPECT_FALSE(d.decode(0).sidecar->Wait(absl::Seconds(1)).ok()) << "the decode sidecar died";
  // Its pages come free: the prefill is gone, so it can write nothing more.
  if (failed->pages() == v1::PAGES_HELD) {
    absl::StatusOr<v1::RoomEvent> freed = d.PagesFree(0, 1, absl::Seconds(30));
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_TRUE(freed->pages_proven()) << freed->reason();
  }
}

// A decode stopped past its room's deadline, then resumed: the prefill fails the room within
// the deadline plus the fence bound, keeps serving, and the resumed decode hears Failed, asks
// for the fence, and is told its pages are free only when nothing can land in them.
TEST_P(FaultsTest, ADecodeStoppedPastTheDeadlineThenResumedGetsFailedAndIntactPages) {
  auto started = StartLargeRoom(GetParam());
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  absl::SleepFor(absl::Milliseconds(20));
  d.decode(0).sidecar->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  absl::StatusOr<v1::RoomEvent> prefill_failed = d.Event(d.prefill(), 1, absl::Seconds(30));
  ASSERT_TRUE(prefill_failed.ok()) << prefill_failed.status();
  const absl::Duration took = absl::Now() - stopped;
  if (prefill_failed->status() == v1::TRANSFER_POLL_SUCCESS) {
    d.decode(0).sidecar->Signal(SIGCONT);
    GTEST_SKIP() << "the room landed before the stop";
  }
  EXPECT_LT(took, absl::Seconds(2 + 1 + 3)) << prefill_failed->reason();  // deadline + fence
  std::printf("[%s] decode stopped mid-room: prefill room failed after %s: %s\n", GetParam(),
              absl::FormatDuration(took).c_str(), prefill_failed->reason().c_str());
  absl::SleepFor(absl::Seconds(1));
  d.decode(0).sidecar->Signal(SIGCONT);
  absl::StatusOr<v1::RoomEvent> freed = d.PagesFree(0, 1, absl::Seconds(30));
  ASSERT_TRUE(freed.ok()) << freed.status();
  const uint64_t overwritten = d.OverwrittenWithin(0, absl::Milliseconds(700));
  std::printf("[%s] resumed decode: pages freed (%s: %s), %llu bytes overwritten after\n",
              GetParam(), freed->pages_proven() ? "proven" : "unproven", freed->reason().c_str(),
              static_cast<unsigned long long>(overwritten));
  if (freed->pages_proven()) {
    EXPECT_EQ(overwritten, 0u);
  }
  // Over tcp the prefill's fence had to disconnect a data plane that did not drain, and said so
  // ("unproven"); the decode then refused that prefill's connections (Transport::RefuseWriter):
  // what was still in its sockets lands nowhere, and the release is proven (decision 0021).
  if (std::string(GetParam()) == "tcp") {
    EXPECT_TRUE(freed->pages_proven()) << freed->reason();
  }
  // The prefill and the decode serve on. The stopped decode's session is quarantined for a
  // while (CACHEPD §7.4: its transfer failed by its own fault, a deadline), so the next room
  // fails at once and says so, instead of waiting on it again.
  const layout::Manifest small = d.Blocks(1, 4);
  ASSERT_TRUE(d.Expect(0, 2, small).ok());
  ASSERT_TRUE(d.Ready(2, small).ok());
  absl::StatusOr<v1::RoomEvent> next = d.Event(d.prefill(), 2, absl::Seconds(30));
  ASSERT_TRUE(next.ok()) << next.status();
  if (next->status() != v1::TRANSFER_POLL_SUCCESS) {
    EXPECT_NE(next->reason().find("quarantined"), std::string::npos) << next->reason();
  }
  absl::StatusOr<v1::RoomEvent> done = d.Event(d.decode(0), 2, absl::Seconds(30));
  ASSERT_TRUE(done.ok()) << done.status();
}

// The bootstrap server restarted mid-run: it forgot every registration; the prefill registers
// again once it answers, and new rooms route and land.
TEST_P(FaultsTest, ARestartedBootstrapIsRegisteredWithAgainAndNewRoomsLand) {
  DeploymentOptions options = TwoDecodes(GetParam());
  options.decodes = 1;
  auto started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  ASSERT_TRUE(d.RestartBootstrap().ok());
  const absl::Time restarted = absl::Now();
  // A new decode has to look the prefill up: restart the decode too, so nothing is cached.
  ASSERT_TRUE(d.RestartDecode(0).ok());
  const absl::Status moved = d.MoveRoom(0, 1, d.Blocks(1, 8));
  EXPECT_TRUE(moved.ok()) << moved;
  const absl::StatusOr<v1::SidecarStats> stats = d.Stats(d.prefill());
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->bootstrap_registrations(), 2u);
  std::printf("[%s] bootstrap restarted: a new room landed %s later\n", GetParam(),
              absl::FormatDuration(absl::Now() - restarted).c_str());
}

// The decode engine killed and restarted against its live sidecar: the new engine attaches the
// same arena again, the rooms of the old one fail (their pages released once fenced), and new
// rooms land.
TEST_P(FaultsTest, AnEngineThatRestartsReattachesAndItsOldRoomsFailCleanly) {
  DeploymentOptions options = TwoDecodes(GetParam());
  options.decodes = 1;
  auto started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  const layout::Manifest manifest = d.Blocks(1, 8);
  ASSERT_TRUE(d.Expect(0, 1, manifest).ok());  // pre-allocated; the prefill is not ready yet
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(d.ReconnectDecodeEngine(0).ok());
  absl::StatusOr<v1::RoomEvent> failed = d.Event(d.decode(0), 1, absl::Seconds(10));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_NE(failed->reason().find("attached again"), std::string::npos) << failed->reason();
  absl::StatusOr<v1::RoomEvent> freed =
      failed->pages() == v1::PAGES_REUSABLE ? failed : d.PagesFree(0, 1, absl::Seconds(30));
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_TRUE(freed->pages_proven() || !freed->pages_released()) << freed->reason();
  // The prefill's engine, ready late for the old room, is refused or told it failed: nothing of
  // it is sent.
  if (d.Ready(1, manifest).ok()) {
    absl::StatusOr<v1::RoomEvent> prefill_side = d.Event(d.prefill(), 1, absl::Seconds(10));
    ASSERT_TRUE(prefill_side.ok()) << prefill_side.status();
    EXPECT_EQ(prefill_side->status(), v1::TRANSFER_POLL_FAILED);
  }
  // The new engine's rooms land.
  const absl::Status moved = d.MoveRoom(0, 2, manifest);
  EXPECT_TRUE(moved.ok()) << moved;
}

// A prefill sidecar that goes (`signal`) while its decode is stopped (SIGSTOP) mid-room, with the
// room's writes backed up in the sockets (tcp), the decode's receive queue (shared memory into
// engine memory) or unacknowledged (verbs); the decode resumed once its heartbeat is due. The
// prefill's process ends within `exits_within`; the decode hears Failed, naming the prefill gone,
// and its pages come free; nothing lands in them afterwards, though what the prefill had handed
// over may still reach the decode as it resumes.
void PrefillGoesWhileItsDecodeIsStopped(const char* tls, int signal, absl::Duration exits_within,
                                        const std::vector<std::string>& reasons) {
  auto started = StartLargeRoom(tls);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  absl::SleepFor(absl::Milliseconds(15));
  d.decode(0).sidecar->Signal(SIGSTOP);
  absl::SleepFor(absl::Milliseconds(100));  // the prefill's writes back up
  d.prefill().sidecar->Signal(signal);
  const absl::Time signalled = absl::Now();
  EXPECT_TRUE(d.prefill().sidecar->Wait(exits_within).ok())
      << "the prefill did not exit within " << exits_within;
  const absl::Duration exited = absl::Now() - signalled;
  // Past the decode's heartbeat interval (2 s) twice: its probe of the prefill is due as it
  // resumes, racing its lanes, which take what the prefill had handed over.
  absl::SleepFor(absl::Milliseconds(4500) - exited);
  d.decode(0).sidecar->Signal(SIGCONT);
  absl::StatusOr<v1::RoomEvent> failed = d.Event(d.decode(0), 1, absl::Seconds(30));
  ASSERT_TRUE(failed.ok()) << failed.status();
  if (failed->status() == v1::TRANSFER_POLL_SUCCESS) {
    GTEST_SKIP() << "the room landed before the stop";
  }
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_TRUE(std::any_of(reasons.begin(), reasons.end(), [&](const std::string& r) {
    return absl::StrContains(failed->reason(), r);
  })) << failed->reason();
  absl::StatusOr<v1::RoomEvent> freed =
      failed->pages() == v1::PAGES_REUSABLE ? failed : d.PagesFree(0, 1, absl::Seconds(30));
  ASSERT_TRUE(freed.ok()) << freed.status();
  const uint64_t overwritten = d.OverwrittenWithin(0, absl::Milliseconds(700));
  std::printf(
      "[%s] prefill %s while its decode was stopped: exited after %s; pages freed (%s: %s), "
      "%llu bytes overwritten after\n",
      tls, strsignal(signal), absl::FormatDuration(exited).c_str(),
      freed->pages_proven() ? "proven" : "unproven", freed->reason().c_str(),
      static_cast<unsigned long long>(overwritten));
  EXPECT_EQ(overwritten, 0u);
  EXPECT_FALSE(d.decode(0).sidecar->Wait(absl::Milliseconds(1)).ok()) << "the decode died";
  // Over tcp and verbs, a decode whose probe found the killed prefill gone refused its connections
  // before giving the pages back: what the dead prefill had handed over (to the kernel; to the
  // software provider's ring) lands nowhere, whenever the decode would take it
  // (Transport::RefuseWriter). (A prefill that shut down said goodbye on each connection after its
  // last write: over tcp there is nothing left of it to refuse.)
  if ((std::string(tls) == "tcp" || std::string(tls) == "verbs") && signal == SIGKILL &&
      absl::StrContains(failed->reason(), "gone")) {
    std::ifstream log(Deployment::LogPath("decode0"));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(absl::StrContains(text, "is gone: its ") &&
                absl::StrContains(text, " connection(s) refused"))
        << "the decode's log (" << Deployment::LogPath("decode0") << ") does not say it refused "
        << "the dead prefill's connections";
  }
}

TEST_P(FaultsTest, APrefillKilledWhileItsDecodeIsStoppedFailsTheRoomAndNothingLandsAfter) {
  PrefillGoesWhileItsDecodeIsStopped(GetParam(), SIGKILL, absl::Seconds(5), {"gone"});
}

// SIGTERM: the prefill shuts down, with its decode unable to answer anything, and still exits
// (a stopped peer holds no shutdown up: ucx's Close waits at most 2 s per lane for a peer's last
// flush, Lane::kCloseFenceWait). The decode hears why: the Failed the prefill queued as it shut
// down ("the scheduler shut down"), or, where its probe comes first, the prefill gone.
TEST_P(FaultsTest, APrefillShutDownWhileItsDecodeIsStoppedExitsAndNothingLandsAfter) {
  PrefillGoesWhileItsDecodeIsStopped(GetParam(), SIGTERM, absl::Seconds(10), {"shut down", "gone"});
}

INSTANTIATE_TEST_SUITE_P(Transports, FaultsTest, ::testing::Values("tcp", "sm", "verbs"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvrail::chaos
