// Faults on real processes (docs/RELIABILITY.md): a decode stopped or gone while another is
// served, a prefill killed mid-room, a decode stopped past its room's deadline and resumed, and
// the bootstrap server restarted mid-run. Each asserts that the rooms the fault touches fail
// within a bound with a reason, that the others succeed, and that no byte lands in pages the
// engine was told are free.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/chaos/deployment.h"
#include "tests/support/byte_count.h"

namespace kvrail::chaos {
namespace {

// The p-th percentile (0..100) of `values`.
absl::Duration Percentile(std::vector<absl::Duration> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p / 100.0 * values.size()));
  return values[index];
}

// `rooms` rooms of `blocks` blocks to decode `d`, one after another: each room's latency, from
// the prefill's Ready to the decode's Success. Before each, the prefill is made ready for one
// of `stuck` (rooms another decode pre-allocated before it stopped), so that it writes to the
// stopped decode while it serves `d`.
std::vector<absl::Duration> Latencies(Deployment& dep, int d, int rooms, int64_t blocks,
                                      uint64_t& room, std::vector<uint64_t> stuck = {}) {
  std::vector<absl::Duration> out;
  const layout::Manifest manifest = dep.Blocks(1, blocks);
  for (int i = 0; i < rooms; ++i) {
    if (!stuck.empty()) {
      // Refused once the prefill knows the other decode is gone (its probe dropped the
      // session): either way nothing of it may slow `d`.
      (void)dep.Ready(stuck.back(), manifest);
      stuck.pop_back();
    }
    const uint64_t id = room++;
    EXPECT_TRUE(dep.Expect(d, id, manifest).ok());
    const absl::Time start = absl::Now();
    EXPECT_TRUE(dep.Ready(id, manifest).ok());
    absl::StatusOr<v1::RoomEvent> done = dep.Event(dep.decode(d), id, absl::Seconds(30));
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) return out;
    EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
    out.push_back(absl::Now() - start);
  }
  return out;
}

// Pre-allocates `rooms` rooms of `blocks` blocks on decode `d` (their Ready comes later).
std::vector<uint64_t> Preallocated(Deployment& dep, int d, int rooms, int64_t blocks,
                                   uint64_t& room) {
  std::vector<uint64_t> ids;
  const layout::Manifest manifest = dep.Blocks(1, blocks);
  for (int i = 0; i < rooms; ++i) {
    ids.push_back(room++);
    EXPECT_TRUE(dep.Expect(d, ids.back(), manifest).ok());
  }
  absl::SleepFor(absl::Milliseconds(300));  // the pre-allocations reach the prefill
  return ids;
}

DeploymentOptions TwoDecodes(const char* tls) {
  DeploymentOptions options;
  options.tls = tls;
  options.decodes = 2;
  options.pages = 33;
  // Quick to see a stopped peer: short deadlines and fence bounds, frequent probes.
  options.prefill_args = {"--transfer-deadline",  "2", "--fence-timeout", "1",
                          "--heartbeat-interval", "2"};
  options.decode_args = {"--heartbeat-interval", "2", "--fence-wait", "5"};
  return options;
}

class FaultsTest : public ::testing::TestWithParam<const char*> {};

// Isolation: the same load to a healthy decode, once alone and once beside a decode that is
// SIGSTOPped (or SIGKILLed) with rooms of its own; p99 stays within 1.5x (plus 20 ms for this
// 2-core machine's scheduling noise). Returns the rooms of the other decode.
std::vector<uint64_t> ExpectIsolated(Deployment& d, const char* tls, int signal,
                                     const char* fault) {
  uint64_t room = 1;
  constexpr int kRooms = 30;
  const std::vector<absl::Duration> alone = Latencies(d, 0, kRooms, 8, room);
  EXPECT_EQ(alone.size(), kRooms);
  const std::vector<uint64_t> stuck = Preallocated(d, 1, kRooms, 8, room);
  d.decode(1).sidecar->Signal(signal);
  if (signal == SIGKILL) {
    EXPECT_TRUE(d.decode(1).sidecar->Wait(absl::Seconds(10)).ok());
  }
  const std::vector<absl::Duration> beside = Latencies(d, 0, kRooms, 8, room, stuck);
  EXPECT_EQ(beside.size(), kRooms);
  if (alone.size() != kRooms || beside.size() != kRooms) return stuck;
  const absl::Duration p99_alone = Percentile(alone, 99), p99_beside = Percentile(beside, 99);
  std::printf(
      "[%s] 16 MiB rooms to a healthy decode: p50 %s / p99 %s alone, p50 %s / p99 %s beside a "
      "%s decode (%.2fx)\n",
      tls, absl::FormatDuration(Percentile(alone, 50)).c_str(),
      absl::FormatDuration(p99_alone).c_str(), absl::FormatDuration(Percentile(beside, 50)).c_str(),
      absl::FormatDuration(p99_beside).c_str(), fault, absl::FDivDuration(p99_beside, p99_alone));
  EXPECT_LE(p99_beside, p99_alone * 1.5 + absl::Milliseconds(20));
  return stuck;
}

TEST_P(FaultsTest, AStoppedDecodeDoesNotSlowAHealthyOne) {
  auto started = Deployment::Start(TwoDecodes(GetParam()));
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  const std::vector<uint64_t> stuck = ExpectIsolated(d, GetParam(), SIGSTOP, "stopped");
  // The stopped decode's rooms fail on the prefill (deadline, then the fence bound).
  const absl::StatusOr<v1::RoomEvent> failed =
      d.Event(d.prefill(), stuck.front(), absl::Seconds(30));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  d.decode(1).sidecar->Signal(SIGCONT);
}

TEST_P(FaultsTest, AGoneDecodeDoesNotSlowAHealthyOne) {
  auto started = Deployment::Start(TwoDecodes(GetParam()));
  ASSERT_TRUE(started.ok()) << started.status();
  ExpectIsolated(**started, GetParam(), SIGKILL, "killed");
}

// A prefill sidecar killed while it writes: the decode sidecar survives, fails the room within
// seconds (its probe of the prefill's socket, not the bootstrap's heartbeat: the bootstrap
// server lives on), and serves a new prefill afterwards.
TEST_P(FaultsTest, APrefillKilledMidRoomLeavesItsDecodeRunningAndFailsTheRoomInSeconds) {
  DeploymentOptions options = TwoDecodes(GetParam());
  options.decodes = 1;
  options.pages = 129;
  auto started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  const layout::Manifest manifest = d.Blocks(1, 128);
  ASSERT_TRUE(d.Expect(0, 1, manifest).ok());
  ASSERT_TRUE(d.Ready(1, manifest).ok());
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
  DeploymentOptions options = TwoDecodes(GetParam());
  options.decodes = 1;
  options.pages = 129;
  auto started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  const layout::Manifest manifest = d.Blocks(1, 128);
  Arena& pages = *d.decode(0).arena;
  ASSERT_TRUE(d.Expect(0, 1, manifest).ok());
  ASSERT_TRUE(d.Ready(1, manifest).ok());
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
  std::memset(pages.data(), 0x5A, pages.size());
  absl::SleepFor(absl::Milliseconds(700));
  const uint64_t overwritten = kvrail::testing::CountBytesNot(pages.data(), pages.size(), 0x5A);
  std::printf("[%s] resumed decode: pages freed (%s: %s), %llu bytes overwritten after\n",
              GetParam(), freed->pages_proven() ? "proven" : "unproven", freed->reason().c_str(),
              static_cast<unsigned long long>(overwritten));
  if (freed->pages_proven()) {
    EXPECT_EQ(overwritten, 0u);
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

INSTANTIATE_TEST_SUITE_P(Transports, FaultsTest, ::testing::Values("tcp", "sm", "verbs"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvrail::chaos
