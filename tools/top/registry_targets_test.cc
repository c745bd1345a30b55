#include "tools/top/registry_targets.h"

#include "gtest/gtest.h"

namespace kvrail::top {
namespace {

TEST(RegistryTargetsTest, AnEntryGivesItsUrlAsATargetNamedHostPort) {
  std::vector<ListedTarget> listed = TargetsFromMetricsEntries(
      {{"/kvrail/v1/metrics/decode-0-a",
        R"({"url": "http://10.0.0.7:9100/metrics", "role": "decode", "rank": 0,
            "session": "10.0.0.7:5000"})"},
       {"/kvrail/v1/metrics/prefill-1-b", R"({"url": "http://[::1]:9101/metrics"})"}});
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].key, "/kvrail/v1/metrics/decode-0-a");
  ASSERT_TRUE(listed[0].target.ok()) << listed[0].target.status();
  EXPECT_EQ(listed[0].target->name, "10.0.0.7:9100");
  EXPECT_EQ(listed[0].target->host, "10.0.0.7");
  EXPECT_EQ(listed[0].target->port, 9100);
  EXPECT_EQ(listed[0].target->path, "/metrics");
  ASSERT_TRUE(listed[1].target.ok()) << listed[1].target.status();
  EXPECT_EQ(listed[1].target->name, "[::1]:9101");
}

TEST(RegistryTargetsTest, ABadEntryIsAnErrorNamingItsKey) {
  std::vector<ListedTarget> listed = TargetsFromMetricsEntries({
      {"/k/1", "not json"},
      {"/k/2", R"({"role": "decode"})"},
      {"/k/3", R"({"url": "10.0.0.1:9100"})"},
      {"/k/4", R"({"url": "http://10.0.0.1/metrics"})"},
  });
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_EQ(listed[0].target.status().message(),
            "registry entry /k/1: the value is not a JSON object");
  EXPECT_EQ(listed[1].target.status().message(), "registry entry /k/2: it has no \"url\" string");
  EXPECT_EQ(listed[2].target.status().message(),
            "registry entry /k/3: url '10.0.0.1:9100' is not http://");
  EXPECT_EQ(listed[3].target.status().message(),
            "registry entry /k/4: endpoint 'http://10.0.0.1/metrics': expected host:port or "
            "http://host:port/path");
}

}  // namespace
}  // namespace kvrail::top
