#include "tools/top/exposition.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrail::top {
namespace {

using ::testing::HasSubstr;

Exposition Parse(absl::string_view text) {
  absl::StatusOr<Exposition> parsed = ParseExposition(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? *std::move(parsed) : Exposition{};
}

std::string ErrorOf(absl::string_view text) {
  absl::StatusOr<Exposition> parsed = ParseExposition(text);
  EXPECT_FALSE(parsed.ok()) << "accepted: " << text;
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(ExpositionTest, HelpAndTypeDeclareAFamily) {
  Exposition e = Parse(
      "# HELP kvrail_fences_total Fences this sidecar ran.\n"
      "# TYPE kvrail_fences_total counter\n"
      "kvrail_fences_total 3\n");
  ASSERT_EQ(e.families.size(), 1u);
  EXPECT_EQ(e.families[0].name, "kvrail_fences_total");
  EXPECT_EQ(e.families[0].help, "Fences this sidecar ran.");
  EXPECT_EQ(e.TypeOf("kvrail_fences_total"), MetricType::kCounter);
  ASSERT_EQ(e.samples.size(), 1u);
  EXPECT_EQ(e.samples[0].value, 3);
  EXPECT_TRUE(e.samples[0].labels.empty());
}

TEST(ExpositionTest, HelpTextUnescapesBackslashAndNewline) {
  Exposition e = Parse("# HELP x a\\\\b\\nc \\t stays\nx 1\n");
  EXPECT_EQ(e.families[0].help, "a\\b\nc \\t stays");
}

TEST(ExpositionTest, OtherCommentsAndEmptyLinesAreIgnored) {
  Exposition e = Parse("# just a comment\n\n#HELPER not a keyword\n   \nx 1\n# TYPE y gauge\n");
  ASSERT_EQ(e.samples.size(), 1u);
  EXPECT_EQ(e.TypeOf("x"), MetricType::kUntyped);
  EXPECT_EQ(e.TypeOf("y"), MetricType::kGauge);
}

TEST(ExpositionTest, LabelsKeepTheirOrderAndUnescape) {
  Exposition e = Parse(
      "kvrail_last_failure_info{cause=\"timeout\",room=\"7\",reason=\"said \\\"no\\\"\\nC:\\\\x\"}"
      " 1.7e9\n");
  ASSERT_EQ(e.samples.size(), 1u);
  const Sample& s = e.samples[0];
  ASSERT_EQ(s.labels.size(), 3u);
  EXPECT_EQ(s.labels[0].first, "cause");
  EXPECT_EQ(s.Label("room"), "7");
  EXPECT_EQ(s.Label("reason"), "said \"no\"\nC:\\x");
  EXPECT_EQ(s.Label("absent"), "");
  EXPECT_EQ(s.value, 1.7e9);
}

TEST(ExpositionTest, LabelsMayHaveATrailingCommaAndBlanks) {
  Exposition e = Parse("x{ a = \"1\" , b=\"\", } 2\n");
  ASSERT_EQ(e.samples.size(), 1u);
  EXPECT_EQ(e.samples[0].Label("a"), "1");
  EXPECT_THAT(ErrorOf("x 1\n{} 2\n"), HasSubstr("line 2: expected a metric name"));
}

TEST(ExpositionTest, TrailingCommaAndTimestamp) {
  Exposition e = Parse("x{a=\"1\",b=\"\",} 2 1700000000000\ny{} 3\n");
  ASSERT_EQ(e.samples.size(), 2u);
  EXPECT_EQ(e.samples[0].Label("b"), "");
  EXPECT_EQ(e.samples[0].timestamp_ms, 1700000000000);
  EXPECT_FALSE(e.samples[1].timestamp_ms.has_value());
}

TEST(ExpositionTest, NaNAndInfinitiesAreValues) {
  Exposition e = Parse("a NaN\nb +Inf\nc -Inf\nd -1.5e-3\ne Inf\n");
  ASSERT_EQ(e.samples.size(), 5u);
  EXPECT_TRUE(std::isnan(e.samples[0].value));
  EXPECT_EQ(e.samples[1].value, std::numeric_limits<double>::infinity());
  EXPECT_EQ(e.samples[2].value, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(e.samples[3].value, -1.5e-3);
  EXPECT_EQ(e.samples[4].value, std::numeric_limits<double>::infinity());
}

TEST(ExpositionTest, HistogramSeriesBelongToTheirFamily) {
  Exposition e = Parse(
      "# TYPE kvrail_room_duration_seconds histogram\n"
      "kvrail_room_duration_seconds_bucket{le=\"0.01\"} 1\n"
      "kvrail_room_duration_seconds_bucket{le=\"0.1\"} 4\n"
      "kvrail_room_duration_seconds_bucket{le=\"+Inf\"} 5\n"
      "kvrail_room_duration_seconds_sum 0.42\n"
      "kvrail_room_duration_seconds_count 5\n");
  std::vector<const Sample*> buckets = e.Named("kvrail_room_duration_seconds_bucket");
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[2]->Label("le"), "+Inf");
  EXPECT_EQ(e.Named("kvrail_room_duration_seconds_count")[0]->value, 5);
}

TEST(ExpositionTest, AHistogramBucketNeedsANumericLe) {
  EXPECT_THAT(ErrorOf("# TYPE h histogram\nh_bucket 1\n"),
              HasSubstr("line 2: h_bucket has no 'le' label"));
  EXPECT_THAT(ErrorOf("# TYPE h histogram\nh_bucket{le=\"big\"} 1\n"),
              HasSubstr("line 2: h_bucket has le=\"big\", not a bucket bound"));
  EXPECT_THAT(ErrorOf("# TYPE h histogram\nh 1\n"),
              HasSubstr("line 2: histogram 'h' has a sample without _bucket"));
}

TEST(ExpositionTest, BadLinesAreReportedWithTheirLineNumber) {
  EXPECT_THAT(ErrorOf("ok 1\n\nx{peer=a} 1\n"),
              HasSubstr("line 3: label value of 'peer' is not quoted: x{peer=a} 1"));
  EXPECT_EQ(ErrorOf("x 1\ny\n"), "line 2: the sample has no value: y");
  EXPECT_EQ(ErrorOf("x one\n"), "line 1: value 'one' is not a number: x one");
  EXPECT_EQ(ErrorOf("x{a=\"1\" 2\n"), "line 1: labels are not closed with '}': x{a=\"1\" 2");
  EXPECT_THAT(ErrorOf("x{a=\"open} 2\n"), HasSubstr("line 1: label value of 'a' has no closing"));
  EXPECT_THAT(ErrorOf("x{a=\"\\t\"} 2\n"), HasSubstr("has an escape other than"));
  EXPECT_THAT(ErrorOf("x{a=\"1\",a=\"2\"} 2\n"), HasSubstr("label 'a' appears twice"));
  EXPECT_THAT(ErrorOf("x{a:b=\"1\"} 2\n"), HasSubstr("expected a label name"));
  EXPECT_THAT(ErrorOf("9x 1\n"), HasSubstr("line 1: expected a metric name"));
  EXPECT_THAT(ErrorOf("x 1 12.5\n"), HasSubstr("timestamp '12.5' is not integer milliseconds"));
  EXPECT_THAT(ErrorOf("x 1 2 3\n"), HasSubstr("text after the timestamp"));
  EXPECT_THAT(ErrorOf("x --1\n"), HasSubstr("value '--1' is not a number"));
}

TEST(ExpositionTest, TypeRulesAreEnforced) {
  EXPECT_THAT(ErrorOf("# TYPE x counter\n# TYPE x gauge\n"), HasSubstr("line 2: second TYPE"));
  EXPECT_THAT(ErrorOf("# TYPE x countr\n"), HasSubstr("TYPE 'countr' is not counter"));
  EXPECT_THAT(ErrorOf("x 1\n# TYPE x counter\n"), HasSubstr("comes after its samples"));
  EXPECT_THAT(ErrorOf("# HELP x a\n# HELP x b\n"), HasSubstr("second HELP for 'x'"));
  EXPECT_THAT(ErrorOf("# TYPE\n"), HasSubstr("TYPE needs a metric name"));
}

TEST(ExpositionTest, ALongBadLineIsQuotedShort) {
  std::string line = "x{a=\"" + std::string(500, 'z');
  EXPECT_LT(ErrorOf(line).size(), 200u);
}

}  // namespace
}  // namespace kvrail::top
