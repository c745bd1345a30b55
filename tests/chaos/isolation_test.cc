// Isolation on real processes (docs/RELIABILITY.md): the same load to a healthy decode, once
// alone and once beside a decode that is SIGSTOPped or SIGKILLed with rooms of its own. It
// compares latencies, so it runs alone on the machine (exclusive); the other fault drills on the
// same deployment are faults_test, beside at most one other heavy test.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/time/clock.h"
#include "tests/chaos/deployment.h"

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

class IsolationTest : public ::testing::TestWithParam<const char*> {};

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

TEST_P(IsolationTest, AStoppedDecodeDoesNotSlowAHealthyOne) {
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

TEST_P(IsolationTest, AGoneDecodeDoesNotSlowAHealthyOne) {
  auto started = Deployment::Start(TwoDecodes(GetParam()));
  ASSERT_TRUE(started.ok()) << started.status();
  ExpectIsolated(**started, GetParam(), SIGKILL, "killed");
}

INSTANTIATE_TEST_SUITE_P(Transports, IsolationTest, ::testing::Values("tcp", "sm", "verbs"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvrail::chaos
