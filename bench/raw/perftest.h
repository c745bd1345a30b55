// ucx_perftest, the peer `kvrail bench raw` measures itself against: its command lines for a
// `ucp_put_bw` server and client, and the parser of the client's final result.
//
// ucx_perftest prints bandwidth in "MB/s" that are binary: 2^20 bytes per second (UCX's
// UCS_MBYTE). kvrail reports decimal GB/s (1e9 bytes per second), so one MB/s of ucx_perftest
// is 1048576 / 1e9 = 0.001048576 GB/s here (MibPerSecondToGbps).
#ifndef KVRAIL_BENCH_RAW_PERFTEST_H_
#define KVRAIL_BENCH_RAW_PERFTEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::bench {

// A result line of the client: its "Final" line (the whole run), or, when it printed none (it
// was stopped), its last progress line, whose "overall" columns cover the run so far.
struct PerftestResult {
  bool final = false;
  uint64_t iterations = 0;
  double bandwidth_mib_per_s = 0;  // the "overall" bandwidth column, in 2^20 bytes per second
  double messages_per_s = 0;       // the "overall" message-rate column
};

// Reads the result from a ucx_perftest client's output, with or without -f: the line starting
// "Final:" (final), or else the last line of 8 numbers, bare (-f: final) or after "[thread N]"
// (progress: not final). InvalidArgument (quoting UCX's error line when there is one) when the
// output has no result, or when its header does not announce bandwidth in MB/s.
absl::StatusOr<PerftestResult> ParsePerftestOutput(absl::string_view output);

// Binary megabytes per second (ucx_perftest's MB/s) to decimal GB/s.
inline double MibPerSecondToGbps(double mib_per_s) { return mib_per_s * 1048576.0 / 1e9; }

// One ucp_put_bw run: UCX's transport settings and the test's shape.
struct PerftestRun {
  std::string tls;                 // UCX_TLS for both processes
  std::string net_devices;         // UCX_NET_DEVICES of the client; empty leaves it unset
  std::string server_net_devices;  // the server's; empty means net_devices
  std::string server_host = "127.0.0.1";
  int port = 13337;
  uint64_t block_bytes = 0;
  uint64_t iterations = 0;
  uint64_t warmup = 0;
  int outstanding = 1;  // -O: puts a client keeps posted and not yet complete
  // More UCX settings for both processes, e.g. UCX_TCP_TX_SEG_SIZE.
  std::vector<std::pair<std::string, std::string>> extra_env;
};

// argv of the server (without the binary) and its environment additions.
std::vector<std::string> PerftestServerArgs(const PerftestRun& run);
std::vector<std::pair<std::string, std::string>> PerftestServerEnv(const PerftestRun& run);
// argv of the client (without the binary) and its environment additions.
std::vector<std::string> PerftestClientArgs(const PerftestRun& run);
std::vector<std::pair<std::string, std::string>> PerftestClientEnv(const PerftestRun& run);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_PERFTEST_H_
