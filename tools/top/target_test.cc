#include "tools/top/target.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrail::top {
namespace {

using ::testing::HasSubstr;

TEST(ParseTargetTest, HostPortUrlAndIpv6) {
  absl::StatusOr<Target> t = ParseTarget("127.0.0.1:9100");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, 9100);
  EXPECT_EQ(t->path, "/metrics");
  EXPECT_EQ(t->name, "127.0.0.1:9100");
  t = ParseTarget("http://node-1:80/x/metrics");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "node-1");
  EXPECT_EQ(t->path, "/x/metrics");
  t = ParseTarget("[::1]:9100");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->host, "::1");
}

TEST(ParseTargetTest, ABadEndpointIsNamedWithTheRule) {
  EXPECT_EQ(ParseTarget("node1").status().message(),
            "endpoint 'node1': expected host:port or http://host:port/path");
  EXPECT_THAT(ParseTarget("h:0").status().message(), HasSubstr("from 1 to 65535"));
  EXPECT_THAT(ParseTarget("h:x").status().message(), HasSubstr("from 1 to 65535"));
  EXPECT_THAT(ParseTarget("::1:80").status().message(), HasSubstr("in brackets"));
  EXPECT_THAT(ParseTarget("h:80/metrics").status().message(), HasSubstr("expected host:port"));
  EXPECT_THAT(ParseTarget("https://h:80").status().message(), HasSubstr("https"));
}

}  // namespace
}  // namespace kvrail::top
