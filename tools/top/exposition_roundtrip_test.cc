// The parser reads what kvrail's own writer (engine/metrics/exposition.h) writes: the two
// sides of GET /metrics agree on the format, escapes, histograms and special values included.
#include <cmath>
#include <limits>

#include "engine/metrics/exposition.h"
#include "gtest/gtest.h"
#include "tools/top/exposition.h"

namespace kvrail::top {
namespace {

TEST(ExpositionRoundTripTest, WhatTheWriterWritesParsesBackTheSame) {
  std::vector<metrics::MetricFamily> families;
  families.push_back(
      {"kvrail_last_failure_info",
       "The last failure.\nWith \\ a backslash.",
       metrics::MetricType::kGauge,
       {{"", {{"cause", "timeout"}, {"room", "7"}, {"reason", "said \"no\"\nC:\\x"}}, 1.7e9}}});
  families.push_back({"kvrail_room_duration_seconds",
                      "Rooms.",
                      metrics::MetricType::kHistogram,
                      {{"_bucket", {{"le", "0.01"}}, 1},
                       {"_bucket", {{"le", "+Inf"}}, 3},
                       {"_sum", {}, 0.25},
                       {"_count", {}, 3}}});
  families.push_back({"kvrail_odd",
                      "Specials.",
                      metrics::MetricType::kGauge,
                      {{"", {{"v", "nan"}}, std::numeric_limits<double>::quiet_NaN()},
                       {"", {{"v", "inf"}}, -std::numeric_limits<double>::infinity()},
                       {"", {{"v", "tiny"}}, 1.0000000000000002e-300}}});
  absl::StatusOr<Exposition> parsed = ParseExposition(metrics::ExposeText(families));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->families[0].help, "The last failure.\nWith \\ a backslash.");
  EXPECT_EQ(parsed->TypeOf("kvrail_room_duration_seconds"), MetricType::kHistogram);
  const Sample& failure = *parsed->Named("kvrail_last_failure_info")[0];
  EXPECT_EQ(failure.Label("reason"), "said \"no\"\nC:\\x");
  EXPECT_EQ(failure.value, 1.7e9);
  std::vector<const Sample*> buckets = parsed->Named("kvrail_room_duration_seconds_bucket");
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[1]->Label("le"), "+Inf");
  EXPECT_EQ(parsed->Named("kvrail_room_duration_seconds_count")[0]->value, 3);
  std::vector<const Sample*> odd = parsed->Named("kvrail_odd");
  ASSERT_EQ(odd.size(), 3u);
  EXPECT_TRUE(std::isnan(odd[0]->value));
  EXPECT_EQ(odd[1]->value, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(odd[2]->value, 1.0000000000000002e-300);
}

}  // namespace
}  // namespace kvrail::top
