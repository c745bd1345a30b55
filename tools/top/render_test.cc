#include "tools/top/render.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/top/test_views.h"

namespace kvrail::top {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TopModel Model() { return ThreeEndpoints(); }

FrameOptions Options(int width, int height = 0) {
  FrameOptions o;
  o.width = width;
  o.height = height;
  o.time = "21:50:05 UTC";
  return o;
}

TEST(RenderTest, AFrameHasTotalsRowsPeersAndAFooter) {
  std::vector<std::string> lines = RenderFrame(Model(), Options(200));
  ASSERT_EQ(lines.size(), 8u);
  EXPECT_EQ(
      lines[0],
      "kvrail top  3 endpoints: 2 up, 1 down  sidecar rooms/s 11.0  GB/s 1.250  failed 1 (0.50/s)  "
      "in flight 4.0 KiB");
  EXPECT_THAT(lines[1], StartsWith("ENDPOINT               ROLE      RANK  ROOMS/S     GB/S"));
  EXPECT_EQ(lines[2],
            "127.0.0.1:9101         prefill      0     11.0    1.250    870.1       1    0.50"
            "    4.0 KiB  timeout room 7: no status in 30 s");
  EXPECT_THAT(lines[3], StartsWith("  -> 10.0.0.2:7000"));
  EXPECT_THAT(lines[3], HasSubstr("1.000  GB/s"));
  EXPECT_THAT(lines[4], HasSubstr("0.250  GB/s"));
  EXPECT_EQ(lines[5],
            "127.0.0.1:9100         bootstrap    -        -  8.0 req/s, 2 ranks registered");
  EXPECT_EQ(lines[6], "127.0.0.1:9103         DOWN  no answer: Connection");
  EXPECT_EQ(lines[7], "21:50:05 UTC  every 1.0 s  q to quit");
}

TEST(RenderTest, TheGbPerSecondOfAPeerLinesUpWithItsColumn) {
  std::vector<std::string> lines = RenderFrame(Model(), Options(200));
  EXPECT_EQ(lines[1].find("GB/S") + 4, lines[3].find("1.000") + 5);
}

TEST(RenderTest, TheEndpointColumnFitsTheLongestName) {
  TopModel m = Model();
  m.rows[0].endpoint = "http://node-17.example:9101/metrics";
  std::vector<std::string> lines = RenderFrame(m, Options(200));
  EXPECT_EQ(lines[1].find("ROLE"), lines[2].find("prefill"));
  EXPECT_EQ(lines[1].find("ROLE"), lines[5].find("bootstrap"));
  EXPECT_EQ(lines[1].find("GB/S") + 4, lines[3].find("1.000") + 5);
}

TEST(RenderTest, WithoutAnEarlierScrapeRatesShowAsDashes) {
  TopModel m = Model();
  m.rows[0].has_rates = false;
  m.rows[0].p99_seconds.reset();
  m.rows[0].peers.clear();
  std::vector<std::string> lines = RenderFrame(m, Options(200));
  EXPECT_THAT(lines[2], StartsWith("127.0.0.1:9101         prefill      0        -        -"
                                   "        -       1       -"));
}

TEST(RenderTest, LinesAreCutToTheWidthNeverWrapped) {
  for (int width : {20, 41, 80}) {
    for (const std::string& line : RenderFrame(Model(), Options(width))) {
      EXPECT_LE(line.size(), static_cast<size_t>(width)) << line;
    }
  }
  EXPECT_EQ(RenderFrame(Model(), Options(20))[6], "127.0.0.1:9103      ");
}

TEST(RenderTest, RowsThatDoNotFitAreCountedAndTheFooterStays) {
  std::vector<std::string> lines = RenderFrame(Model(), Options(200, 6));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_THAT(lines[3], StartsWith("  -> 10.0.0.2:7000"));
  EXPECT_EQ(lines[4], "... 3 more lines (a taller terminal shows them)");
  EXPECT_EQ(lines[5], "21:50:05 UTC  every 1.0 s  q to quit");
}

TEST(RenderTest, OnlyTheFastestPeersAreListed) {
  TopModel m = Model();
  FrameOptions o = Options(200);
  o.peers_per_row = 1;
  o.interactive = false;
  std::vector<std::string> lines = RenderFrame(m, o);
  EXPECT_THAT(lines[3], StartsWith("  -> 10.0.0.2:7000"));
  EXPECT_EQ(lines[4], "  -> (1 more peers)");
  EXPECT_EQ(lines.back(), "21:50:05 UTC  every 1.0 s") << "no 'q to quit' outside the view";
}

TEST(RenderTest, AReasonCannotSendEscapesToTheTerminal) {
  TopModel m = Model();
  m.rows[0].last_failure->reason = "bad\x1b[2Jthing\nnext\x7f";
  std::string row = RenderFrame(m, Options(300))[2];
  EXPECT_THAT(row, HasSubstr("bad [2Jthing next "));
  EXPECT_EQ(row.find('\x1b'), std::string::npos);
}

TEST(FitLineTest, CountsAUtf8SequenceAsOneColumnAndNeverSplitsIt) {
  EXPECT_EQ(FitLine("d\xc3\xa9j\xc3\xa0 vu", 4), "d\xc3\xa9j\xc3\xa0");
  EXPECT_EQ(FitLine("ab\xc3", 5), "ab?") << "a cut-off sequence";
  EXPECT_EQ(FitLine("abc", 0), "");
}

TEST(HumanBytesTest, PicksTheUnit) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(4096), "4.0 KiB");
  EXPECT_EQ(HumanBytes(1.5 * (1 << 30)), "1.5 GiB");
}

}  // namespace
}  // namespace kvrail::top
