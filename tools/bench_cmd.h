// `kvrail bench`: transfer benchmarks (docs/ARCHITECTURE.md, "Processes"). `bench raw` measures
// raw write bandwidth beside ucx_perftest (bench/raw/raw_bench.h); `bench raw-target` is its
// target process, started by `bench raw` itself and hidden from help. `bench control` measures
// the control path (bench/control); `bench kv` model-shaped rooms through real sidecars
// (bench/kv/kv_sweep.h).
#ifndef KVRAIL_TOOLS_BENCH_CMD_H_
#define KVRAIL_TOOLS_BENCH_CMD_H_

#include <CLI/CLI.hpp>

namespace kvrail::tools {

// Adds `bench` and its subcommands to `app`; their callbacks set `exit_code` (0 success, 1 the
// run failed, 2 a flag value was wrong), printing one "error: ..." line on stderr.
void AddBench(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_BENCH_CMD_H_
