#include "bench/raw/cpu_usage.h"

#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

TEST(CpuUsageTest, ParsesTheAggregateLine) {
  auto t =
      ParseProcStat("cpu  100 5 40 800 20 3 7 2 9 0\ncpu0 50 2 20 400 10 1 3 1 4 0\nintr 1 2 3\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->total, 100u + 5 + 40 + 800 + 20 + 3 + 7 + 2);  // guest (9) is inside user
  EXPECT_EQ(t->idle, 820u);
  EXPECT_EQ(t->kernel, 50u);
}

TEST(CpuUsageTest, AcceptsAnOlderKernelsSevenFields) {
  auto t = ParseProcStat("cpu 1 2 3 4 5 6 7");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->total, 28u);
}

TEST(CpuUsageTest, RejectsWhatIsNotTheCpuLine) {
  EXPECT_EQ(ParseProcStat("intr 1 2").status().code(), absl::StatusCode::kInvalidArgument);
  auto short_line = ParseProcStat("cpu 1 2 3");
  EXPECT_NE(short_line.status().message().find("at least 7"), std::string::npos)
      << short_line.status();
  auto bad = ParseProcStat("cpu 1 2 x 4 5 6 7");
  EXPECT_NE(bad.status().message().find("\"x\""), std::string::npos) << bad.status();
}

TEST(CpuUsageTest, ShareBetweenTwoReadings) {
  const CpuTimes before{.total = 1000, .idle = 500, .kernel = 100};
  const CpuTimes after{.total = 2000, .idle = 600, .kernel = 800};
  const CpuShare share = ShareBetween(before, after);
  EXPECT_DOUBLE_EQ(share.busy, 0.9);
  EXPECT_DOUBLE_EQ(share.kernel, 0.7);
  const CpuShare none = ShareBetween(after, after);
  EXPECT_EQ(none.busy, 0);
  EXPECT_EQ(none.kernel, 0);
}

TEST(CpuUsageTest, ReadsThisMachine) {
  auto t = ReadCpuTimes();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_GT(t->total, 0u);
  EXPECT_LE(t->idle, t->total);
}

}  // namespace
}  // namespace kvrail::bench
