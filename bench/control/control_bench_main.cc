// Standalone `bench control`: bazel run -c opt //bench/control:control_bench -- [flags]
//
//   --in-flight=1,10,100,1000   rooms kept in flight, one row each
//   --seconds=1.0               measured window per row
//   --warmup=0.2                warm-up per row
//   --link=tcp|shm              what carries the bytes between the sidecars (UCX tcp, UCX shm)
//   --engine-api=ipc|tcp        the engine API sockets
//   --pages=0                   pages per room (0: empty payloads)
//   --no-paced                  no paced row (20000 rooms/s offered, <= 100 in flight)
//   --json                      JSON instead of the table
//   --quiet                     no progress lines on stderr
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/control/control_bench.h"

namespace {

bool Parse(int argc, char** argv, kvrail::bench::ControlBenchOptions& options, std::string& error) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    bool ok = true;
    if (name == "--json") {
      options.json = true;
    } else if (name == "--no-paced") {
      options.paced_target_row = false;
    } else if (name == "--quiet") {
      options.progress = false;
    } else if (name == "--in-flight") {
      options.in_flight.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(part, &n);
        options.in_flight.push_back(n);
      }
    } else if (name == "--seconds") {
      ok = absl::SimpleAtod(value, &options.seconds_per_row);
    } else if (name == "--warmup") {
      ok = absl::SimpleAtod(value, &options.warmup_seconds);
    } else if (name == "--link") {
      options.link = value;
    } else if (name == "--transport") {
      error = "--transport was renamed --link (tcp or shm)";
      return false;
    } else if (name == "--engine-api") {
      options.engine_api = value;
    } else if (name == "--pages") {
      ok = absl::SimpleAtoi(value, &options.pages_per_room);
    } else {
      error = "unknown flag " + arg;
      return false;
    }
    if (!ok) {
      error = "flag " + arg + ": not a number (list)";
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  kvrail::bench::ControlBenchOptions options;
  std::string error;
  if (!Parse(argc, argv, options, error)) {
    std::fprintf(stderr,
                 "control_bench: %s\nusage: control_bench [--in-flight=1,10,100,1000] "
                 "[--seconds=1] [--warmup=0.2] [--link=tcp|shm] [--engine-api=ipc|tcp] "
                 "[--pages=0] [--no-paced] [--json] [--quiet]\n",
                 error.c_str());
    return 2;
  }
  const absl::Status status = kvrail::bench::RunControlBench(options);
  if (!status.ok()) {
    std::fprintf(stderr, "control_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
