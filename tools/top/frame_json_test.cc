#include "tools/top/frame_json.h"

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "tools/top/test_views.h"

namespace kvrail::top {
namespace {

TEST(FrameJsonTest, CarriesEveryNumberOfTheFrame) {
  TopModel m = ThreeEndpoints();
  m.rows[0].last_failure->reason = "bad \xff byte";
  FrameOptions options;
  options.time = "21:50:05 UTC";
  nlohmann::json j = nlohmann::json::parse(FrameJson(m, options));
  EXPECT_EQ(j["time"], "21:50:05 UTC");
  EXPECT_EQ(j["totals"]["up"], 2);
  EXPECT_EQ(j["totals"]["down"], 1);
  EXPECT_EQ(j["totals"]["bytes_per_second"], 1.25e9);
  ASSERT_EQ(j["endpoints"].size(), 3u);
  const nlohmann::json& e = j["endpoints"][0];
  EXPECT_EQ(e["kind"], "sidecar");
  EXPECT_EQ(e["role"], "prefill");
  EXPECT_EQ(e["session"], "127.0.0.1:7000");
  EXPECT_EQ(e["rooms_per_second"], 11);
  EXPECT_EQ(e["peers"][1]["peer"], "10.0.0.3:7000");
  EXPECT_EQ(e["peers"][1]["bytes_per_second"], 2.5e8);
  EXPECT_EQ(e["p99_seconds"], 0.8701);
  EXPECT_EQ(j["endpoints"][1]["kind"], "bootstrap");
  EXPECT_EQ(j["endpoints"][1]["requests_per_second"], 8);
  EXPECT_EQ(e["last_failure"]["cause"], "timeout");
  EXPECT_EQ(e["last_failure"]["reason"], "bad \xEF\xBF\xBD byte") << "bad UTF-8 replaced";
  EXPECT_FALSE(j["endpoints"][2]["up"]);
  EXPECT_EQ(j["endpoints"][2]["error"], "no answer: Connection");
  EXPECT_TRUE(j["endpoints"][2]["p99_seconds"].is_null());
  EXPECT_TRUE(j["endpoints"][2]["last_failure"].is_null());
}

}  // namespace
}  // namespace kvrail::top
