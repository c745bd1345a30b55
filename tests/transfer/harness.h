// Runs a planned transfer between real processes (transfer_node) and verifies it byte by byte
// from this process, which maps every arena by name: every destination byte of every planned
// copy equals its source byte, and every other destination byte is still zero.
#ifndef KVRAIL_TESTS_TRANSFER_HARNESS_H_
#define KVRAIL_TESTS_TRANSFER_HARNESS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cluster/node_host.h"
#include "cluster/process/subprocess.h"
#include "engine/memory/arena.h"
#include "tests/transfer/route_fixture.h"

namespace kvrail::testing {

struct HarnessOptions {
  // "tcp" or "sm" (UCX), or "verbs" (the verbs backend over the software provider, its rail on
  // the net devices below)
  std::string tls = "tcp";
  // Where each side's nodes run (cluster/node_host.h, as a cluster's do): the argv prefix (e.g.
  // {"ip", "netns", "exec", "kvrail-b"}), the address the decode binds, the UCX tcp device.
  cluster::NodeHost decode_node{{}, "127.0.0.1", "lo"};
  cluster::NodeHost prefill_node{{}, "127.0.0.1", "lo"};
  int rooms = 1;
  absl::Duration timeout = absl::Seconds(120);
  // Extra arguments for every prefill node (e.g. "--out-of-bounds", "--deadline-ms", "3000").
  std::vector<std::string> prefill_args;
  // Failure drills: the prefills are expected to fail (their "result failed ..." lines are
  // returned) and every decode arena must still be all zero.
  bool expect_failure = false;
  // SIGKILL decode 0 as soon as every prefill has submitted its rooms.
  bool kill_decode_after_submit = false;
  // RunWriterKillDrill: the decode node's arena is its transport's own (Transport::Allocate, as
  // a sidecar gives its engine by default), mapped here through /proc/<pid>/fd, instead of
  // engine-owned POSIX shared memory that the node registers.
  bool decode_allocates = false;
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

// The POSIX shared-memory name of the arena of `role` ("p" prefill, "d" decode) rank `rank`,
// unique to this process.
std::string ArenaName(const char* role, int rank);

// A decode node (options.tls, decode_bind and decode_net_devices), started and its handshake up,
// serving the existing arena `arena`, or with `allocate_bytes` an arena its transport allocates
// (mapped here as `allocated`). It exits 0 when its stdin closes.
struct DecodeNode {
  std::unique_ptr<process::Subprocess> process;
  std::string session;             // its data-plane handshake endpoint, "ip:port"
  std::optional<Arena> allocated;  // the file that holds the allocated arena
  uint64_t allocated_offset = 0;   // where the arena starts in it
};
absl::StatusOr<DecodeNode> StartDecodeNode(const HarnessOptions& options, const std::string& arena,
                                           uint64_t allocate_bytes = 0);

// True while `process` has not exited.
bool Running(process::Subprocess& process);

// The writer-kill drill (FAILURE-MODEL: a dead prefill must cost its decode nothing): against one
// decode node (setup with prefill_tp and decode_tp 1; options.decode_allocates chooses its
// arena), `kills` prefill nodes in turn start a train of rooms, are SIGKILLed once the first
// bytes have landed in the decode arena, and the decode node must still run after each; then a
// fresh prefill moves options.rooms rooms, verified byte for byte as RunTransfer does, and the
// decode node exits 0.
struct WriterKillResult {
  int writers_killed = 0;
  HarnessResult final_transfer;
};
absl::StatusOr<WriterKillResult> RunWriterKillDrill(const RouteSetup& setup,
                                                    const HarnessOptions& options, int kills);

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_TRANSFER_HARNESS_H_
