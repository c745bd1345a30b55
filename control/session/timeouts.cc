#include "control/session/timeouts.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvrail::session {
namespace {

absl::Status BadValue(const char* name, absl::string_view value, absl::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", name, "=\"", value, "\": ", rule, " (CACHEPD §7.4)"));
}

// Reads `name` as decimal seconds into `out` when it is set.
absl::Status ReadSeconds(EnvLookup lookup, const char* name, bool allow_negative,
                         absl::Duration& out) {
  const char* text = lookup(name);
  if (text == nullptr) return absl::OkStatus();
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !std::isfinite(seconds)) {
    return BadValue(name, text, "must be a finite number of seconds");
  }
  if (seconds < 0 && !allow_negative) return BadValue(name, text, "must not be negative");
  out = absl::Seconds(seconds);
  return absl::OkStatus();
}

}  // namespace

absl::Duration EffectiveHeartbeatInterval(const SessionTimeouts& timeouts) {
  return std::max(timeouts.heartbeat_interval, absl::Seconds(2));
}

int EffectiveHeartbeatMaxFailures(const SessionTimeouts& timeouts) {
  return std::max(timeouts.heartbeat_max_failures, 1);
}

absl::StatusOr<SessionTimeouts> TimeoutsFromEnvironment(EnvLookup lookup) {
  SessionTimeouts timeouts;
  absl::Status status = ReadSeconds(lookup, "TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
                                    /*allow_negative=*/false, timeouts.bootstrap_timeout);
  if (!status.ok()) return status;
  status = ReadSeconds(lookup, "TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT",
                       /*allow_negative=*/false, timeouts.waiting_timeout);
  if (!status.ok()) return status;
  status = ReadSeconds(lookup, "TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL",
                       /*allow_negative=*/false, timeouts.heartbeat_interval);
  if (!status.ok()) return status;
  status = ReadSeconds(lookup, "TOKENSPEED_DISAGGREGATION_FAILED_SESSION_TTL",
                       /*allow_negative=*/true, timeouts.failed_session_ttl);
  if (!status.ok()) return status;
  if (timeouts.failed_session_ttl < absl::ZeroDuration()) {
    timeouts.failed_session_ttl = absl::ZeroDuration();
  }
  const char* failures = lookup("TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE");
  if (failures != nullptr) {
    int value = 0;
    if (!absl::SimpleAtoi(failures, &value)) {
      return BadValue("TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", failures,
                      "must be a decimal integer");
    }
    timeouts.heartbeat_max_failures = value;
  }
  return timeouts;
}

}  // namespace kvrail::session
