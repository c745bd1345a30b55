#include "cluster/process/cpu_time.h"

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrail::process {

absl::StatusOr<uint64_t> ParseCpuTicks(absl::string_view stat) {
  // "<pid> (<comm>) <state> <ppid> ...": the fields after the last ')' start at field 3.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("/proc/<pid>/stat: no \"(comm)\" field");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipWhitespace());
  constexpr size_t kUtime = 14 - 3;
  constexpr size_t kStime = 15 - 3;
  if (fields.size() <= kStime) {
    return absl::InvalidArgumentError(absl::StrCat("/proc/<pid>/stat: ", fields.size() + 2,
                                                   " fields; utime and stime are 14 and 15"));
  }
  uint64_t utime = 0;
  uint64_t stime = 0;
  if (!absl::SimpleAtoi(fields[kUtime], &utime) || !absl::SimpleAtoi(fields[kStime], &stime)) {
    return absl::InvalidArgumentError(absl::StrCat("/proc/<pid>/stat: utime \"", fields[kUtime],
                                                   "\" or stime \"", fields[kStime],
                                                   "\" is not a number"));
  }
  return utime + stime;
}

absl::StatusOr<double> CpuSeconds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": process gone?"));
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<uint64_t> ticks = ParseCpuTicks(stat);
  if (!ticks.ok()) return ticks.status();
  return static_cast<double>(*ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace kvrail::process
