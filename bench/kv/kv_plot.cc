#include "bench/kv/kv_plot.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "bench/kv/kv_report.h"
#include "bench/kv/plot_kv_script.h"
#include "cluster/process/subprocess.h"
#include "engine/base/error.h"

namespace kvrail::bench {

absl::Status PlotKvSweep(const KvSweepResult& result, const std::string& image) {
  char path[] = "/tmp/kvrail-bench-kv-XXXXXX.json";
  const int fd = mkstemps(path, 5);
  if (fd < 0) return absl::InternalError("bench kv --plot: cannot create a file under /tmp");
  const std::string json = KvSweepToJson(result);
  const bool written = write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
  close(fd);
  if (!written) {
    unlink(path);
    return absl::InternalError(absl::StrCat("bench kv --plot: cannot write ", path));
  }
  process::SpawnOptions options = process::SpawnOptions::ContainedTool();
  options.argv = {"/usr/bin/python3", "-c", kPlotKvPy, path, "-o", image};
  options.stderr_mode = process::SpawnOptions::Stderr::kToStdout;
  absl::StatusOr<std::unique_ptr<process::Subprocess>> python = process::Subprocess::Start(options);
  if (!python.ok()) {
    unlink(path);
    return absl::UnavailableError(
        absl::StrCat("bench kv --plot: /usr/bin/python3: ", python.status().message()));
  }
  absl::StatusOr<std::string> output = (*python)->ReadAll(absl::Seconds(120));
  absl::StatusOr<int> code = (*python)->Wait(absl::Seconds(5));
  unlink(path);
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat("bench kv --plot ", image, ": plot_kv.py failed: ",
                                            output.ok() ? *output : output.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace kvrail::bench
