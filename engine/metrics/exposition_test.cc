#include "engine/metrics/exposition.h"

#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "engine/metrics/registry.h"
#include "gtest/gtest.h"

namespace kvrail::metrics {
namespace {

// One sample line read back by the format's grammar (version 0.0.4).
struct Parsed {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // values unescaped
  std::string value;
};

// Reads `text` line by line: every line must be a HELP, a TYPE or a sample line; a sample's
// name must belong to the family of the TYPE line above it. Fails the test otherwise.
std::vector<Parsed> ParseExposition(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (([^\\\n]|\\\\|\\n)*))");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::regex kSample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([-+]?([0-9.eE+-]+|Inf|NaN)))");
  static const std::regex kLabel(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)\",?)");
  std::vector<Parsed> out;
  std::string family;
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "the exposition ends with a newline";
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_match(line, m, kHelp)) continue;
    if (std::regex_match(line, m, kType)) {
      family = m[1];
      continue;
    }
    if (!std::regex_match(line, m, kSample)) {
      ADD_FAILURE() << "not a line of the format: " << line;
      continue;
    }
    Parsed parsed{m[1], {}, m[4]};
    EXPECT_EQ(parsed.name.rfind(family, 0), 0u) << "sample outside its family: " << line;
    std::string labels = m[3];
    std::string rest = labels;
    std::smatch lm;
    while (!rest.empty()) {
      if (!std::regex_search(rest, lm, kLabel) || lm.position(0) != 0) {
        ADD_FAILURE() << "bad label set: " << labels;
        break;
      }
      std::string value;
      const std::string raw = lm[2];
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size()) {
          ++i;
          value += raw[i] == 'n' ? '\n' : raw[i];
        } else {
          value += raw[i];
        }
      }
      parsed.labels.emplace_back(lm[1], value);
      rest = lm.suffix();
    }
    out.push_back(std::move(parsed));
  }
  return out;
}

TEST(ExpositionTest, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

TEST(ExpositionTest, ValuesAreIntegersInfinitiesOrExactDecimals) {
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
  EXPECT_EQ(std::strtod(FormatValue(0.1).c_str(), nullptr), 0.1);
}

TEST(ExpositionTest, EveryLineReadsBackByTheGrammar) {
  Registry registry;
  registry.AddCounter("kvrail_rooms_total", "Rooms ended.\nBy outcome.", {"outcome", "cause"})
      .With({"failed", "a \"quoted\" \\ cause\nwith a newline"})
      .Add(2);
  registry.AddGauge("kvrail_bytes_in_flight", "Bytes posted, not landed").With().Set(1.5);
  registry.AddHistogram("kvrail_room_duration_seconds", "Room time", {0.1, 1}).With();
  const std::vector<Parsed> samples = ParseExposition(registry.Expose());
  ASSERT_EQ(samples.size(), 2u + 5u);
  EXPECT_EQ(samples[0].name, "kvrail_rooms_total");
  ASSERT_EQ(samples[0].labels.size(), 2u);
  EXPECT_EQ(samples[0].labels[1].second, "a \"quoted\" \\ cause\nwith a newline");
  EXPECT_EQ(samples[0].value, "2");
  EXPECT_EQ(samples[1].value, "1.5");
}

TEST(ExpositionTest, HistogramBucketsAreCumulativeAndInfEqualsCount) {
  Registry registry;
  Histogram& histogram =
      registry.AddHistogram("kvrail_fence_duration_seconds", "Fences", {0.01, 0.1, 1}, {"side"})
          .With({"prefill"});
  for (double v : {0.005, 0.01, 0.05, 0.5, 0.7, 3.0}) histogram.Observe(v);
  const std::vector<Parsed> samples = ParseExposition(registry.Expose());
  std::map<std::string, std::string> buckets;
  std::string sum, count;
  for (const Parsed& p : samples) {
    if (p.name == "kvrail_fence_duration_seconds_bucket") {
      ASSERT_EQ(p.labels.size(), 2u);
      EXPECT_EQ(p.labels[0], (std::pair<std::string, std::string>("side", "prefill")));
      EXPECT_EQ(p.labels[1].first, "le");
      buckets[p.labels[1].second] = p.value;
    } else if (p.name == "kvrail_fence_duration_seconds_sum") {
      sum = p.value;
    } else if (p.name == "kvrail_fence_duration_seconds_count") {
      count = p.value;
    }
  }
  // A value equal to a bound counts in that bound's bucket ("less than or equal").
  EXPECT_EQ(buckets["0.01"], "2");
  EXPECT_EQ(buckets["0.1"], "3");
  EXPECT_EQ(buckets["1"], "5");
  EXPECT_EQ(buckets["+Inf"], "6");
  EXPECT_EQ(count, "6");
  EXPECT_NEAR(std::strtod(sum.c_str(), nullptr), 4.265, 1e-9);
  // The +Inf bucket is the last bucket line, right before _sum and _count.
  ASSERT_GE(samples.size(), 3u);
  EXPECT_EQ(samples[samples.size() - 3].labels.back().second, "+Inf");
}

TEST(ExpositionTest, HelpAndTypeComeBeforeTheSamplesOfEachFamily) {
  MetricFamily family{"kvrail_x", "help", MetricType::kGauge, {{"", {}, 1}}};
  EXPECT_EQ(ExposeText({family}), "# HELP kvrail_x help\n# TYPE kvrail_x gauge\nkvrail_x 1\n");
}

}  // namespace
}  // namespace kvrail::metrics
