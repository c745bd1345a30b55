#include "bench/control/control_bench.h"

#include <gtest/gtest.h>

#include <string>

namespace kvrail::bench {
namespace {

ControlBenchOptions Short() {
  ControlBenchOptions options;
  options.in_flight = {1, 10};
  options.seconds_per_row = 0.2;
  options.warmup_seconds = 0.05;
  options.paced_target_row = false;
  options.progress = false;
  return options;
}

TEST(ControlBenchTest, EveryRoomOfEveryRowSucceedsWithEmptyPayloads) {
  absl::StatusOr<ControlBenchResult> result = MeasureControlBench(Short());
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->rows.size(), 2u);
  EXPECT_EQ(result->rows[0].in_flight, 1);
  EXPECT_EQ(result->rows[1].in_flight, 10);
  for (const ControlBenchRow& row : result->rows) {
    EXPECT_GT(row.rooms, 0u) << row.in_flight;
    EXPECT_GT(row.rooms_per_s, 0) << row.in_flight;
    EXPECT_GT(row.p50_ms, 0) << row.in_flight;
    EXPECT_GE(row.p99_ms, row.p50_ms) << row.in_flight;
    EXPECT_GE(row.max_ms, row.p99_ms) << row.in_flight;
  }
  EXPECT_EQ(result->payload_bytes, 0u);
  EXPECT_GE(result->rooms_total, result->rows[0].rooms + result->rows[1].rooms);
  // No row at 100 in flight: the target is reported as not measured, never as met.
  EXPECT_FALSE(result->target_measured);
  const std::string json = FormatControlBenchJson(*result);
  EXPECT_EQ(json.rfind("{\"rows\":[{\"in_flight\":1,", 0), 0u) << json;
  EXPECT_NE(json.find("\"measured\":false"), std::string::npos) << json;
  EXPECT_NE(json.find("\"pass\":false"), std::string::npos) << json;
  const std::string table = FormatControlBenchTable(*result);
  EXPECT_NE(table.find("target: not measured"), std::string::npos) << table;
}

TEST(ControlBenchTest, RoomsWithAPagePayloadSucceedAndReportTheirBytes) {
  ControlBenchOptions options = Short();
  options.in_flight = {4};
  options.pages_per_room = 1;
  absl::StatusOr<ControlBenchResult> result = MeasureControlBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GT(result->payload_bytes, 0u);
  EXPECT_GT(result->rows[0].rooms, 0u);
}

TEST(ControlBenchTest, APacedRowOffersRoomsOnAClockAndIsJudgedSeparately) {
  ControlBenchOptions options = Short();
  options.in_flight = {5};
  options.paced_target_row = true;
  options.target_in_flight = 5;
  options.target_rooms_per_s = 500;
  absl::StatusOr<ControlBenchResult> result = MeasureControlBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->rows.size(), 2u);
  EXPECT_EQ(result->rows[0].rate, 0);
  EXPECT_EQ(result->rows[1].rate, 500);
  EXPECT_EQ(result->rows[1].in_flight, 5);
  EXPECT_GT(result->rows[1].rooms, 0u);
  EXPECT_TRUE(result->target_measured);
  EXPECT_TRUE(result->paced_measured);
  const std::string table = FormatControlBenchTable(*result);
  EXPECT_NE(table.find("paced 500/s, <= 5 in flight"), std::string::npos) << table;
  EXPECT_NE(table.find("target rate offered"), std::string::npos) << table;
}

TEST(ControlBenchTest, BadOptionsAreRefusedNamingTheOption) {
  ControlBenchOptions options = Short();
  options.in_flight = {0};
  EXPECT_NE(MeasureControlBench(options).status().message().find("in_flight 0"), std::string::npos);
  options = Short();
  options.link = "rdma";
  EXPECT_NE(MeasureControlBench(options).status().message().find("link \"rdma\""),
            std::string::npos);
}

TEST(ControlBenchTest, LinkSmIsRefusedAskingForShm) {
  ControlBenchOptions options = Short();
  options.link = "sm";
  const absl::Status refused = CheckControlBenchOptions(options);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("link \"sm\": write shm"), std::string::npos) << refused;
  options.link = "shm";
  EXPECT_TRUE(CheckControlBenchOptions(options).ok());
}

}  // namespace
}  // namespace kvrail::bench
