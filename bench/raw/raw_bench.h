// `kvrail bench raw`: write bandwidth and operations per second of the data plane between two
// processes, for every (link, block size, batch size), beside ucx_perftest
// `ucp_put_bw` at the same block size run in the same invocation, and beside memcpy with as many
// threads as kvrail has lanes, at the row's working set, as the limit (issue point 6).
//
// For each link: a target process (raw_target.h) registers its arena; this process
// registers a patterned source arena, connects, checks that writes of every block size land
// byte-exact (from a shifted source offset), then measures one window per row through the
// transfer scheduler (write_window.h) after a short unmeasured warm-up, and has the target check
// a sample of every measured window's blocks (the first, a middle and the last written) against
// the pattern at that window's source shift; a mismatch fails the bench naming the row. Each row
// also measures kvrail with one lane (a one-lane transport of its own, to the same target) for
// the like-for-like comparison with ucx_perftest at kvrail's UCX settings. The target then exits
// and ucx_perftest runs, server and client as two processes with the same UCX_TLS and
// UCX_NET_DEVICES, with -O (puts outstanding) set to the row's batch size bounded by the same bytes
// in flight per endpoint that kvrail keeps.
//
// Both sides make their transports through transport::MakeTransport (raw_target.h,
// TransportSpecFor). verbs: the raw verbs backend, provider from KVRAIL_VERBS_PROVIDER (the
// target inherits it), measured as the UCX transports are but with no baseline (ucx_perftest
// measures UCX; perftest's ib_write_bw is not run); over the software provider (softverbs) a row
// is a functional run whose rates are never shown as a bandwidth (RawRow::bandwidth_claim).
//
// netns: two network namespaces joined by a veth pair (cluster/netns.h); the target and the
// ucx_perftest server run in one, and the measuring side in the other: this binary re-runs
// itself there (`--netns-side`) and reads its rows as JSON.
#ifndef KVRAIL_BENCH_RAW_RAW_BENCH_H_
#define KVRAIL_BENCH_RAW_RAW_BENCH_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/raw/raw_flags.h"
#include "bench/raw/raw_report.h"
#include "engine/transport/landing_copy.h"

namespace kvrail::bench {

// How kvrail posts on one link: the scheduler's knobs (SchedulerOptions) and the transfers
// the window keeps in flight.
struct RawTuning {
  int lanes = 2;
  uint64_t slice_bytes = uint64_t{1} << 20;  // SchedulerOptions::slice_bytes
  // SchedulerOptions::max_inflight_bytes_per_endpoint: posted and not yet complete, per lane.
  uint64_t inflight_bytes_per_lane = uint64_t{8} << 20;
  int transfers_per_lane = 64;  // transfers (batches) in flight at most, per lane
};

// The defaults per link, from measurements on the development machines (see the report
// in bench/raw/README.md).
RawTuning DefaultTuning(RawLink link);

// Where the measuring process sits when it measures netns from inside the first namespace.
struct NetnsSide {
  std::string target_netns;    // the namespace of the target and the ucx_perftest server
  std::string local_device;    // this side's veth
  std::string target_device;   // the other side's veth
  std::string target_address;  // its IPv4 address
};

// Parses "target_netns,local_device,target_device,target_address".
absl::StatusOr<NetnsSide> ParseNetnsSide(const std::string& text);

struct RawBenchOptions {
  std::vector<RawLink> links = {RawLink::kTcp, RawLink::kShm};
  std::vector<uint64_t> block_sizes = {uint64_t{4} << 10, uint64_t{64} << 10, uint64_t{1} << 20,
                                       uint64_t{64} << 20};
  std::vector<int> batch_sizes = {1, 32, 1024};
  double seconds = 0.5;  // per measured window (kvrail), and the aim for ucx_perftest's run
  // Each figure (kvrail's window, each ucx_perftest run) is the best of this many runs, which
  // keeps a neighbour's burst on a shared machine out of the ratio.
  int repeat = 2;
  // Overrides of DefaultTuning; 0 keeps the default.
  int lanes = 0;
  uint64_t inflight_bytes_per_lane = 0;
  uint64_t slice_bytes = 0;
  int transfers_per_lane = 0;
  // UCX: how both sides' lanes store what lands (engine/transport/landing_copy.h), as a
  // sidecar's --landing-stores.
  transport::LandingStores landing_stores = transport::LandingStores::kAuto;
  bool run_peer = true;  // run ucx_perftest
  std::string self_exe;  // this binary, re-run as the target (and inside netns)
  std::string perftest = "ucx_perftest";
  std::optional<NetnsSide> netns_side;
  std::FILE* progress = nullptr;  // progress lines (a bar on a terminal); nullptr: quiet
};

// Measures every row. The first failure of setup or verification is returned; a ucx_perftest
// run that fails or does not finish leaves its row's peer figure empty with a note.
absl::StatusOr<std::vector<RawRow>> RunRawBench(const RawBenchOptions& options);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_RAW_BENCH_H_
