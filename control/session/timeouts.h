// Timeouts and heartbeat settings of the room state machines (CACHEPD §7.4), with the
// reference's defaults and environment variables, plus the bounded memories kvrail adds (§11.2).
#ifndef KVRAIL_CONTROL_SESSION_TIMEOUTS_H_
#define KVRAIL_CONTROL_SESSION_TIMEOUTS_H_

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrail::session {

struct SessionTimeouts {
  // Prefill: the longest a begun room may stay Bootstrapping, measured from BeginRoom
  // (TOKENSPEED_DISAGGREGATION_BOOTSTRAP_TIMEOUT).
  absl::Duration bootstrap_timeout = absl::Seconds(120);
  // Decode: the longest a room may wait for its Success messages, measured from the moment its
  // pre-allocations were sent (TOKENSPEED_DISAGGREGATION_WAITING_TIMEOUT).
  absl::Duration waiting_timeout = absl::Seconds(300);
  // Decode: the /health probe period the caller should use; at least 2 s
  // (TOKENSPEED_DISAGGREGATION_HEARTBEAT_INTERVAL).
  absl::Duration heartbeat_interval = absl::Seconds(5);
  // Decode: consecutive failed probes that declare a prefill node dead; at least 1
  // (TOKENSPEED_DISAGGREGATION_HEARTBEAT_MAX_FAILURE).
  int heartbeat_max_failures = 2;
  // Prefill: how long a decode session stays quarantined after a failed transfer; zero
  // disables the quarantine (TOKENSPEED_DISAGGREGATION_FAILED_SESSION_TTL, where <= 0 does).
  absl::Duration failed_session_ttl = absl::Seconds(30);
  // Prefill, kvrail only (CACHEPD §11.2): how long a freed Failed room is remembered, so that
  // a late pre-allocation for it is answered with Failed instead of hanging its decode.
  absl::Duration failed_room_ttl = absl::Seconds(120);
  // Prefill, kvrail only (CACHEPD §11.2): the longest pre-allocations may wait for a room the
  // engine never begins; then the room fails and its decode ranks are told.
  absl::Duration unmatched_preallocation_timeout = absl::Seconds(120);
};

// The reference's rules for the two clamped settings: an interval below 2 s is 2 s, and fewer
// than 1 failure is 1 (CACHEPD §1.6).
absl::Duration EffectiveHeartbeatInterval(const SessionTimeouts& timeouts);
int EffectiveHeartbeatMaxFailures(const SessionTimeouts& timeouts);

// Returns the value of an environment variable, or nullptr when it is unset.
using EnvLookup = absl::FunctionRef<const char*(const char* name)>;

// The defaults above, overridden by the CACHEPD §7.4 variables that are set: the three
// durations and the TTL as decimal seconds ("120", "2.5"), the failure count as a decimal
// integer. A failed-session TTL <= 0 disables the quarantine. Fails (InvalidArgument) on a
// value that is not a finite number, naming the variable and its value; a negative timeout is
// refused the same way.
absl::StatusOr<SessionTimeouts> TimeoutsFromEnvironment(EnvLookup lookup);

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_TIMEOUTS_H_
