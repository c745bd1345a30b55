#include "control/registry/keys.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvrail::registry {
namespace {

using ::testing::HasSubstr;

TEST(KeysTest, SessionKeyRoundTripsItsSessionId) {
  EXPECT_EQ(SessionKey("127.0.0.1:4711"), "/kvrail/v1/sessions/127.0.0.1:4711");
  EXPECT_EQ(SessionIdOfKey(SessionKey("127.0.0.1:4711")), "127.0.0.1:4711");
  EXPECT_EQ(SessionIdOfKey("/kvrail/v1/nodes/x:1"), "");
}

TEST(KeysTest, OtherKeysFollowTheLayout) {
  EXPECT_EQ(MetricsKey("decode", 3, "10.0.0.2:4711"), "/kvrail/v1/metrics/decode-3-10.0.0.2:4711");
  EXPECT_EQ(BootstrapMetricsKey("10.0.0.1:8998"), "/kvrail/v1/metrics/bootstrap-10.0.0.1:8998");
  EXPECT_EQ(NodeKey("10.0.0.1:8998"), "/kvrail/v1/nodes/10.0.0.1:8998");
  EXPECT_EQ(BootstrapPrefix("10.0.0.1:8998"), "/kvrail/v1/bootstrap/10.0.0.1:8998/");
}

TEST(KeysTest, SessionEntryRoundTrips) {
  SessionEntry entry;
  entry.descriptor = std::string("\x00\x01proto", 7);
  entry.version = 3;
  entry.tp_rank = 2;
  entry.metrics = "127.0.0.1:9100";
  auto decoded = DecodeSessionEntry("k", EncodeSessionEntry(entry));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->descriptor, entry.descriptor);
  EXPECT_EQ(decoded->version, 3);
  EXPECT_EQ(decoded->role, "decode");
  EXPECT_EQ(decoded->tp_rank, 2);
  EXPECT_EQ(decoded->metrics, "127.0.0.1:9100");
}

TEST(KeysTest, SessionEntryWithoutMetricsLeavesTheFieldOut) {
  SessionEntry entry;
  entry.descriptor = "d";
  EXPECT_THAT(EncodeSessionEntry(entry), ::testing::Not(HasSubstr("metrics")));
}

TEST(KeysTest, MalformedSessionEntriesNameTheKeyAndTheField) {
  const std::string key = "/kvrail/v1/sessions/h:1";
  EXPECT_THAT(std::string(DecodeSessionEntry(key, "not json").status().message()),
              HasSubstr("registry entry /kvrail/v1/sessions/h:1: the value is not a JSON object"));
  EXPECT_THAT(std::string(DecodeSessionEntry(key, R"({"version":1,"role":"decode","tp_rank":0})")
                              .status()
                              .message()),
              HasSubstr("\"descriptor\""));
  EXPECT_THAT(std::string(DecodeSessionEntry(
                              key, R"({"descriptor":"ZA==","version":"1","role":"d","tp_rank":0})")
                              .status()
                              .message()),
              HasSubstr("\"version\""));
  EXPECT_THAT(std::string(DecodeSessionEntry(
                              key, R"({"descriptor":"ZA==","version":1,"role":"d","tp_rank":-1})")
                              .status()
                              .message()),
              HasSubstr("\"tp_rank\""));
}

}  // namespace
}  // namespace kvrail::registry
