// Runs a planned transfer between real processes (transfer_node) and verifies it byte by byte
// from this process, which maps every arena by name: every destination byte of every planned
// copy equals its source byte, and every other destination byte is still zero.
#ifndef KVRAIL_TESTS_TRANSFER_HARNESS_H_
#define KVRAIL_TESTS_TRANSFER_HARNESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tests/transfer/route_fixture.h"

namespace kvrail::testing {

struct HarnessOptions {
  std::string tls = "tcp";  // "tcp" or "sm"
  std::string decode_bind = "127.0.0.1";
  std::string decode_net_devices = "lo";
  std::string prefill_net_devices = "lo";
  // Commands put in front of a node's argv, e.g. {"ip", "netns", "exec", "kvrail-b"}.
  std::vector<std::string> decode_prefix;
  std::vector<std::string> prefill_prefix;
  int rooms = 1;
  absl::Duration timeout = absl::Seconds(120);
  // Extra arguments for every prefill node (e.g. "--out-of-bounds", "--deadline-ms", "3000").
  std::vector<std::string> prefill_args;
  // Failure drills: the prefills are expected to fail (their "result failed ..." lines are
  // returned) and every decode arena must still be all zero.
  bool expect_failure = false;
  // SIGKILL decode 0 as soon as every prefill has submitted its rooms.
  bool kill_decode_after_submit = false;
};

struct HarnessResult {
  uint64_t bytes_verified = 0;        // destination bytes compared with their source
  uint64_t bytes_untouched = 0;       // destination bytes checked to be still zero
  double seconds = 0;                 // the slowest prefill's transfer time
  std::vector<std::string> failures;  // with expect_failure: each prefill's "failed ..." line
  absl::Duration failure_latency;     // with kill_decode_after_submit: kill to last failure
};

// The path of the transfer_node binary (absolute, so it survives `ip netns exec`).
std::string NodePath();

absl::StatusOr<HarnessResult> RunTransfer(const RouteSetup& setup, const HarnessOptions& options);

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_TRANSFER_HARNESS_H_
