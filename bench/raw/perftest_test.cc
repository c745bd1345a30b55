#include "bench/raw/perftest.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrail::bench {
namespace {

// Output captured from ucx_perftest 1.13.1 (Debian ucx-utils) on the development machine.
std::string Sample(const std::string& name) {
  std::ifstream in("bench/raw/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ParsePerftestOutput, ReadsTheFinalLineAndItsOverallColumns) {
  // -s 65536 -O 16 over tcp: progress lines, then "Final:".
  auto result = ParsePerftestOutput(Sample("ucx_perftest_put_bw_tcp_progress.txt"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->final);
  EXPECT_EQ(result->iterations, 40000u);
  EXPECT_DOUBLE_EQ(result->bandwidth_mib_per_s, 327.91);  // overall, not the last interval
  EXPECT_DOUBLE_EQ(result->messages_per_s, 5247);
}

TEST(ParsePerftestOutput, ReadsTheBareFinalLineOfDashF) {
  auto result = ParsePerftestOutput(Sample("ucx_perftest_put_bw_shm_final_only.txt"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->final);
  EXPECT_EQ(result->iterations, 2000u);
  EXPECT_DOUBLE_EQ(result->bandwidth_mib_per_s, 5994.16);
}

TEST(ParsePerftestOutput, ReadsTheLastProgressLineOfAStoppedRunAsNotFinal) {
  auto result = ParsePerftestOutput(Sample("ucx_perftest_put_bw_tcp_stopped.txt"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->final);
  EXPECT_EQ(result->iterations, 1024u);
  EXPECT_DOUBLE_EQ(result->bandwidth_mib_per_s, 338.56);
}

TEST(ParsePerftestOutput, QuotesUcxErrorWhenThereIsNoResult) {
  auto result = ParsePerftestOutput(Sample("ucx_perftest_connection_refused.txt"));
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::StrContains(result.status().message(), "Connection refused"))
      << result.status();
}

TEST(ParsePerftestOutput, RejectsAResultWithoutTheMbPerSecondHeader) {
  auto result = ParsePerftestOutput(
      "Final:                 20000      2.196     2.113     2.113    29578.85   29578.85      "
      "473262      473262\n");
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::StrContains(result.status().message(), "MB/s"));
}

TEST(MibPerSecondToGbps, ConvertsBinaryMegabytesToDecimalGigabytes) {
  // 2.113 us per 64 KiB put = 31.02e9 B/s = 29578.85 * 2^20 B/s.
  EXPECT_NEAR(MibPerSecondToGbps(29578.85), 31.016, 0.001);
  EXPECT_DOUBLE_EQ(MibPerSecondToGbps(1e3), 1.048576);
}

TEST(PerftestArgs, ClientRunsPutBandwidthWithSizeIterationsAndOutstanding) {
  PerftestRun run;
  run.tls = "tcp";
  run.net_devices = "vethA";
  run.server_net_devices = "vethB";
  run.server_host = "10.213.0.2";
  run.port = 40000;
  run.block_bytes = 1 << 20;
  run.iterations = 500;
  run.warmup = 50;
  run.outstanding = 4;
  const std::vector<std::string> client = PerftestClientArgs(run);
  const std::vector<std::string> expected = {"10.213.0.2", "-p",      "40000", "-t",  "ucp_put_bw",
                                             "-s",         "1048576", "-n",    "500", "-w",
                                             "50",         "-O",      "4"};
  EXPECT_EQ(client, expected);
  EXPECT_EQ(PerftestServerArgs(run), (std::vector<std::string>{"-p", "40000"}));
  const auto server_env = PerftestServerEnv(run);
  ASSERT_EQ(server_env.size(), 2u);
  EXPECT_EQ(server_env[1].second, "vethB");
  EXPECT_EQ(PerftestClientEnv(run)[1].second, "vethA");
}

}  // namespace
}  // namespace kvrail::bench
