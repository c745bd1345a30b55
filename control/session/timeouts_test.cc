// CACHEPD §7.4: the defaults, the environment variables and the clamped heartbeat settings.
#include "control/session/timeouts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace kvrail::session {
namespace {

using ::testing::HasSubstr;

struct FakeEnvironment {
  std::map<std::string, std::string> values;
  const char* operator()(const char* name) const {
    auto found = values.find(name);
    return found == values.end() ? nullptr : found->second.c_str();
  }
};

TEST(TimeoutsTest, DefaultsAreTheReferences) {
  SessionTimeouts timeouts;
  EXPECT_EQ(timeouts.bootstrap_timeout, absl::Seconds(120));
  EXPECT_EQ(timeouts.waiting_timeout, absl::Seconds(300));
  EXPECT_EQ(timeouts.heartbeat_interval, absl::Seconds(5));
  EXPECT_EQ(timeouts.heartbeat_max_failures, 2);
  EXPECT_EQ(timeouts.failed_session_ttl, absl::Seconds(30));
  FakeEnvironment empty;
  absl::StatusOr<SessionTimeouts> from_env = TimeoutsFromEnvironment(empty);
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_env->bootstrap_timeout, absl::Seconds(120));
  EXPECT_EQ(from_env->waiting_timeout, absl::Seconds(300));
}

TEST(TimeoutsTest, EnvironmentOverridesEachSetting) {
  FakeEnvironment env{{
      {"TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "7.5"},
      {"TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT", "9"},
      {"TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL", "3"},
      {"TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "4"},
      {"TOKENSPEED_DISAGGREGATION_FAILED_SESSION_TTL", "11"},
  }};
  absl::StatusOr<SessionTimeouts> timeouts = TimeoutsFromEnvironment(env);
  ASSERT_TRUE(timeouts.ok()) << timeouts.status();
  EXPECT_EQ(timeouts->bootstrap_timeout, absl::Milliseconds(7500));
  EXPECT_EQ(timeouts->waiting_timeout, absl::Seconds(9));
  EXPECT_EQ(timeouts->heartbeat_interval, absl::Seconds(3));
  EXPECT_EQ(timeouts->heartbeat_max_failures, 4);
  EXPECT_EQ(timeouts->failed_session_ttl, absl::Seconds(11));
}

TEST(TimeoutsTest, NonPositiveSessionTtlDisablesTheQuarantine) {
  FakeEnvironment env{{{"TOKENSPEED_DISAGGREGATION_FAILED_SESSION_TTL", "-1"}}};
  absl::StatusOr<SessionTimeouts> timeouts = TimeoutsFromEnvironment(env);
  ASSERT_TRUE(timeouts.ok());
  EXPECT_EQ(timeouts->failed_session_ttl, absl::ZeroDuration());
}

TEST(TimeoutsTest, HeartbeatSettingsAreClampedAsTheReferenceDoes) {
  SessionTimeouts timeouts;
  timeouts.heartbeat_interval = absl::Milliseconds(500);
  timeouts.heartbeat_max_failures = 0;
  EXPECT_EQ(EffectiveHeartbeatInterval(timeouts), absl::Seconds(2));
  EXPECT_EQ(EffectiveHeartbeatMaxFailures(timeouts), 1);
}

TEST(TimeoutsTest, MalformedValuesNameTheVariable) {
  for (const auto& [name, value] : std::map<std::string, std::string>{
           {"TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "soon"},
           {"TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT", "-3"},
           {"TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL", "nan"},
           {"TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2.5"}}) {
    FakeEnvironment env{{{name, value}}};
    absl::StatusOr<SessionTimeouts> timeouts = TimeoutsFromEnvironment(env);
    ASSERT_FALSE(timeouts.ok()) << name;
    EXPECT_EQ(timeouts.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(timeouts.status().message(), HasSubstr(name));
  }
}

}  // namespace
}  // namespace kvrail::session
