// `kvrail bench kv --plot FILE`: the sweep drawn by plot_kv.py (Debian's python3-matplotlib),
// which is compiled into the binary so that the command needs no source tree.
#ifndef KVRAIL_BENCH_KV_KV_PLOT_H_
#define KVRAIL_BENCH_KV_KV_PLOT_H_

#include <string>

#include "absl/status/status.h"
#include "bench/kv/kv_result.h"

namespace kvrail::bench {

// Writes the plot of `result` to `image` (.png or .svg) with /usr/bin/python3 (the system's,
// which has matplotlib; another python3 may shadow it in PATH). Unavailable naming the
// interpreter when it cannot run; Internal with the script's own words when it fails.
absl::Status PlotKvSweep(const KvSweepResult& result, const std::string& image);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_PLOT_H_
