#include "control/sidecar/sidecar_metrics.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/metrics/registry.h"
#include "gtest/gtest.h"

namespace kvrail::sidecar {
namespace {

// The value of the sample `name` (with its suffix) whose labels include every one of `labels`;
// -1 when there is none.
double Value(const SidecarMetrics& m, const std::string& name, const metrics::Labels& labels = {}) {
  for (const metrics::MetricFamily& family : m.registry().Collect()) {
    for (const metrics::Sample& sample : family.samples) {
      if (family.name + sample.suffix != name) continue;
      bool all = true;
      for (const auto& label : labels) {
        bool found = false;
        for (const auto& have : sample.labels) found = found || have == label;
        all = all && found;
      }
      if (all) return sample.value;
    }
  }
  return -1;
}

TEST(SidecarMetricsTest, AFailedRoomCountsItsCauseAndBecomesTheLastFailure) {
  SidecarMetrics m;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  m.RoomSeen(7, t0);
  m.RoomEnded(7, false, session::FailureCause::kAborted, "aborted by the engine \"now\"\nreally",
              t0 + absl::Seconds(2));
  EXPECT_EQ(Value(m, "kvrail_rooms_total", {{"outcome", "failed"}, {"cause", "aborted"}}), 1);
  EXPECT_EQ(Value(m, "kvrail_last_failure_info",
                  {{"cause", "aborted"},
                   {"room", "7"},
                   {"reason", "aborted by the engine \"now\"\nreally"}}),
            1002);
  // The histogram got the room: 2 s, in the buckets from 2.5 s up.
  EXPECT_EQ(Value(m, "kvrail_room_duration_seconds_count"), 1);
  EXPECT_EQ(Value(m, "kvrail_room_duration_seconds_sum"), 2);
  EXPECT_EQ(Value(m, "kvrail_room_duration_seconds_bucket", {{"le", "1"}}), 0);
  EXPECT_EQ(Value(m, "kvrail_room_duration_seconds_bucket", {{"le", "2.5"}}), 1);
  // The next failure replaces it: one series at most.
  m.RoomEnded(8, false, session::FailureCause::kTimeout, "bootstrap timeout",
              t0 + absl::Seconds(3));
  EXPECT_EQ(Value(m, "kvrail_last_failure_info", {{"room", "7"}}), -1);
  EXPECT_EQ(Value(m, "kvrail_last_failure_info", {{"room", "8"}, {"cause", "timeout"}}), 1003);
}

TEST(SidecarMetricsTest, ASucceededRoomHasAnEmptyCauseAndNoFailure) {
  SidecarMetrics m;
  m.RoomEnded(1, true, session::FailureCause::kNone, "", absl::Now());
  EXPECT_EQ(Value(m, "kvrail_rooms_total", {{"outcome", "succeeded"}, {"cause", ""}}), 1);
  EXPECT_EQ(Value(m, "kvrail_last_failure_info"), -1);
}

TEST(SidecarMetricsTest, BatchesCountBytesPerPeerAndLaneAndTheFirstByte) {
  SidecarMetrics m;
  const absl::Time t0 = absl::Now();
  m.RoomReady(3, t0);
  auto on_batch = m.BatchCounter(3, "127.0.0.1:9000", 2);
  on_batch({1, 100, 4, false, false});
  EXPECT_EQ(Value(m, "kvrail_bytes_in_flight"), 100);
  on_batch({1, 100, 4, true, true});
  on_batch({0, 50, 1, false, false});
  on_batch({0, 50, 1, true, false});  // failed: in flight no more, not counted
  EXPECT_EQ(Value(m, "kvrail_bytes_in_flight"), 0);
  EXPECT_EQ(Value(m, "kvrail_bytes_total", {{"peer", "127.0.0.1:9000"}, {"lane", "1"}}), 100);
  EXPECT_EQ(Value(m, "kvrail_writes_total", {{"peer", "127.0.0.1:9000"}, {"lane", "1"}}), 4);
  EXPECT_EQ(Value(m, "kvrail_bytes_total", {{"lane", "0"}}), 0);
  EXPECT_EQ(Value(m, "kvrail_room_first_byte_seconds_count"), 1);
}

TEST(SidecarMetricsTest, AFenceIsCountedWithItsDuration) {
  SidecarMetrics m;
  const absl::Time t0 = absl::Now();
  m.FenceBegan(4, t0);
  m.FenceEnded(4, t0 + absl::Milliseconds(500));
  m.FenceObserved(absl::Seconds(1));
  EXPECT_EQ(Value(m, "kvrail_fences_total"), 2);
  EXPECT_EQ(Value(m, "kvrail_fence_duration_seconds_sum"), 1.5);
}

TEST(SidecarMetricsTest, DroppedSessionsAreCountedByWhyAndTakeTheirPeerSeries) {
  SidecarMetrics m;
  auto counter = m.BatchCounter(3, "10.0.0.9:5000", 1);
  counter({/*lane=*/0, /*bytes=*/100, /*writes=*/2, /*completed=*/true, /*ok=*/true});
  EXPECT_EQ(Value(m, "kvrail_bytes_total", {{"peer", "10.0.0.9:5000"}}), 100);
  m.SessionDropped("10.0.0.9:5000", "refused");
  m.SessionDropped("10.0.0.8:5000", "refused");
  m.SessionDropped("10.0.0.7:5000", "other_process");
  EXPECT_EQ(Value(m, "kvrail_sessions_dropped_total", {{"why", "refused"}}), 2);
  EXPECT_EQ(Value(m, "kvrail_sessions_dropped_total", {{"why", "other_process"}}), 1);
  // The dropped peer's series are gone; a batch still in flight counts safely into nothing.
  EXPECT_EQ(Value(m, "kvrail_bytes_total", {{"peer", "10.0.0.9:5000"}}), -1);
  EXPECT_EQ(Value(m, "kvrail_writes_total", {{"peer", "10.0.0.9:5000"}}), -1);
  counter({/*lane=*/0, /*bytes=*/100, /*writes=*/2, /*completed=*/true, /*ok=*/true});
  EXPECT_EQ(Value(m, "kvrail_bytes_total", {{"peer", "10.0.0.9:5000"}}), -1);
}

TEST(SidecarMetricsTest, TableSizesAreReadAtScrapeTime) {
  SidecarMetrics m;
  SidecarStats stats;
  m.SetStatsSource([&stats] { return stats; });
  stats.rooms = 5;
  stats.peer_messages = 9;
  stats.lane_wakes_by_event = 3;
  stats.lane_wakes_by_job = 4;
  stats.lane_naps_ended = 6;
  stats.writes_stored_together = 7;
  EXPECT_EQ(Value(m, "kvrail_table_entries", {{"table", "rooms"}}), 5);
  EXPECT_EQ(Value(m, "kvrail_peer_messages_total"), 9);
  EXPECT_EQ(Value(m, "kvrail_lane_wakes_by_event_total"), 3);
  EXPECT_EQ(Value(m, "kvrail_lane_wakes_by_job_total"), 4);
  EXPECT_EQ(Value(m, "kvrail_lane_naps_ended_total"), 6);
  EXPECT_EQ(Value(m, "kvrail_writes_stored_together_total"), 7);
}

}  // namespace
}  // namespace kvrail::sidecar
