#include "tools/json_log_format.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace kvrail::tools {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

// The lines `log` writes through a JsonLogFormatter("decode", 3).
std::string Logged(const std::function<void(spdlog::logger&)>& log) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
  spdlog::logger logger("kvrail-sidecar", sink);
  logger.set_formatter(std::make_unique<JsonLogFormatter>("decode", 3));
  log(logger);
  return out.str();
}

nlohmann::json OneLine(const std::string& text) {
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;  // one line, newline-terminated
  return nlohmann::json::parse(text);
}

TEST(KeyValuePairsTest, PlainAndQuotedValues) {
  EXPECT_EQ(KeyValuePairs("event=curve_refused peer=tcp://10.0.0.2:5000 reason=\"bad key\" "
                          "held_back=0"),
            (Pairs{{"event", "curve_refused"},
                   {"peer", "tcp://10.0.0.2:5000"},
                   {"reason", "bad key"},
                   {"held_back", "0"}}));
}

TEST(KeyValuePairsTest, EscapedQuotesAndBackslashesInAQuotedValue) {
  EXPECT_EQ(KeyValuePairs(R"(reason="say \"hi\" \\ there" next=1)"),
            (Pairs{{"reason", R"(say "hi" \ there)"}, {"next", "1"}}));
}

TEST(KeyValuePairsTest, WordsThatAreNotPairsAreSkipped) {
  EXPECT_EQ(KeyValuePairs("prefill rank 0: arena of 4096 bytes attached a==b =x"), Pairs{});
  EXPECT_EQ(KeyValuePairs("decode rank 1: room=7 failed"), (Pairs{{"room", "7"}}));
}

TEST(KeyValuePairsTest, AnUnterminatedQuoteRunsToTheEnd) {
  EXPECT_EQ(KeyValuePairs("reason=\"cut off"), (Pairs{{"reason", "cut off"}}));
}

TEST(JsonLogFormatterTest, FixedFieldsThenThePairs) {
  const nlohmann::json line = OneLine(Logged([](spdlog::logger& logger) {
    logger.warn("event=curve_refused peer={} reason=\"{}\" held_back={}", "tcp://10.0.0.2:5000",
                "no such key", 2);
  }));
  EXPECT_EQ(line["level"], "warning");
  EXPECT_EQ(line["logger"], "kvrail-sidecar");
  EXPECT_EQ(line["role"], "decode");
  EXPECT_EQ(line["rank"], 3);
  EXPECT_EQ(line["msg"],
            "event=curve_refused peer=tcp://10.0.0.2:5000 reason=\"no such key\" held_back=2");
  EXPECT_EQ(line["event"], "curve_refused");
  EXPECT_EQ(line["reason"], "no such key");
  EXPECT_EQ(line["held_back"], 2);
  const std::string ts = line["ts"];
  ASSERT_EQ(ts.size(), 24u) << ts;  // 2026-12-03T21:45:00.123Z
  EXPECT_EQ(ts[10], 'T');
  EXPECT_EQ(ts.back(), 'Z');
}

TEST(JsonLogFormatterTest, QuotesNewlinesAndControlBytesAreEscaped) {
  const std::string text = Logged([](spdlog::logger& logger) {
    logger.info("a \"quoted\" word\nsecond line\tand a tab \\ backslash \x01");
  });
  const nlohmann::json line = OneLine(text);
  EXPECT_EQ(line["msg"], "a \"quoted\" word\nsecond line\tand a tab \\ backslash \x01");
}

TEST(JsonLogFormatterTest, NonAsciiKeptAndInvalidUtf8Replaced) {
  nlohmann::json line =
      OneLine(Logged([](spdlog::logger& logger) { logger.info("model=Qwen–7B 名前 ok"); }));
  EXPECT_EQ(line["msg"], "model=Qwen–7B 名前 ok");
  EXPECT_EQ(line["model"], "Qwen–7B");
  line = OneLine(Logged([](spdlog::logger& logger) { logger.info("bytes \xff\xfe end"); }));
  EXPECT_EQ(line["msg"], "bytes \xEF\xBF\xBD\xEF\xBF\xBD end");  // U+FFFD each
}

TEST(JsonLogFormatterTest, NumbersOnlyWhenTheyAreIntegers) {
  const nlohmann::json line = OneLine(Logged([](spdlog::logger& logger) {
    logger.info("a=12 b=-3 c=007 d=1.5 e=12ab f= g=99999999999999999999");
  }));
  EXPECT_EQ(line["a"], 12);
  EXPECT_EQ(line["b"], -3);
  EXPECT_EQ(line["c"], "007");
  EXPECT_EQ(line["d"], "1.5");
  EXPECT_EQ(line["e"], "12ab");
  EXPECT_EQ(line["f"], "");
  EXPECT_EQ(line["g"], "99999999999999999999");
}

TEST(JsonLogFormatterTest, PairsNeverOverwriteTheFixedFields) {
  const nlohmann::json line =
      OneLine(Logged([](spdlog::logger& logger) { logger.info("level=high rank=9 msg=x"); }));
  EXPECT_EQ(line["level"], "info");
  EXPECT_EQ(line["rank"], 3);
  EXPECT_EQ(line["kv_level"], "high");
  EXPECT_EQ(line["kv_rank"], 9);
  EXPECT_EQ(line["kv_msg"], "x");
}

}  // namespace
}  // namespace kvrail::tools
