#include "bench/raw/perftest.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace kvrail::bench {
namespace {

// The eight numbers of a result line: iterations, overhead 50%ile / average / overall (usec),
// bandwidth average / overall (MB/s), message rate average / overall. Averages may be "inf".
bool ParseResultLine(absl::string_view line, PerftestResult& result) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
  if (fields.size() != 8) return false;
  uint64_t iterations = 0;
  if (!absl::SimpleAtoi(fields[0], &iterations)) return false;
  double values[7];
  for (int i = 0; i < 7; ++i) {
    if (!absl::SimpleAtod(fields[i + 1], &values[i])) return false;
  }
  result.iterations = iterations;
  result.bandwidth_mib_per_s = values[4];
  result.messages_per_s = values[6];
  return true;
}

}  // namespace

absl::StatusOr<PerftestResult> ParsePerftestOutput(absl::string_view output) {
  std::vector<absl::string_view> lines = absl::StrSplit(output, '\n');
  std::string error_line;
  bool mb_per_s = false;
  bool found = false;
  bool found_final = false;
  PerftestResult result;
  for (absl::string_view line : lines) {
    if (absl::StrContains(line, "bandwidth (MB/s)")) mb_per_s = true;
    if (absl::StrContains(line, "ERROR") && error_line.empty()) {
      error_line = std::string(absl::StripAsciiWhitespace(line));
    }
    absl::string_view rest = absl::StripAsciiWhitespace(line);
    PerftestResult parsed;
    if (absl::ConsumePrefix(&rest, "Final:")) {
      if (ParseResultLine(rest, parsed)) {
        result = parsed;
        result.final = found = found_final = true;
      }
    } else if (!found_final) {
      // "[thread 0]" marks a progress line; -f prints the final line bare.
      const bool progress = absl::ConsumePrefix(&rest, "[thread ");
      if (progress) rest.remove_prefix(std::min(rest.size(), rest.find(']') + 1));
      if (ParseResultLine(rest, parsed)) {
        result = parsed;
        result.final = !progress;
        found = true;
      }
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx_perftest printed no final result",
                     error_line.empty() ? "" : absl::StrCat(" (", error_line, ")")));
  }
  if (!mb_per_s) {
    return absl::InvalidArgumentError(
        "ucx_perftest output has a result but no \"bandwidth (MB/s)\" header; its units are "
        "unknown");
  }
  if (result.iterations == 0 || !(result.bandwidth_mib_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx_perftest's final result is empty: %u iterations at %g MB/s",
                        result.iterations, result.bandwidth_mib_per_s));
  }
  return result;
}

std::vector<std::string> PerftestServerArgs(const PerftestRun& run) {
  return {"-p", absl::StrCat(run.port)};
}

std::vector<std::pair<std::string, std::string>> PerftestServerEnv(const PerftestRun& run) {
  std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", run.tls}};
  const std::string& devices =
      run.server_net_devices.empty() ? run.net_devices : run.server_net_devices;
  if (!devices.empty()) env.emplace_back("UCX_NET_DEVICES", devices);
  env.insert(env.end(), run.extra_env.begin(), run.extra_env.end());
  return env;
}

std::vector<std::string> PerftestClientArgs(const PerftestRun& run) {
  return {run.server_host,
          "-p",
          absl::StrCat(run.port),
          "-t",
          "ucp_put_bw",
          "-s",
          absl::StrCat(run.block_bytes),
          "-n",
          absl::StrCat(run.iterations),
          "-w",
          absl::StrCat(run.warmup),
          "-O",
          absl::StrCat(run.outstanding)};
}

std::vector<std::pair<std::string, std::string>> PerftestClientEnv(const PerftestRun& run) {
  std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", run.tls}};
  if (!run.net_devices.empty()) env.emplace_back("UCX_NET_DEVICES", run.net_devices);
  env.insert(env.end(), run.extra_env.begin(), run.extra_env.end());
  return env;
}

}  // namespace kvrail::bench
