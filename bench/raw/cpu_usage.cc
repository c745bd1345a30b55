#include "bench/raw/cpu_usage.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrail::bench {

absl::StatusOr<CpuTimes> ParseProcStat(absl::string_view text) {
  const absl::string_view line = text.substr(0, text.find('\n'));
  std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.empty() || words[0] != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/stat: the first line should be the aggregate \"cpu\" line, got \"",
                     line.substr(0, 80), "\""));
  }
  // user nice system idle iowait irq softirq [steal guest guest_nice]
  constexpr int kNeeded = 7;
  if (words.size() < 1 + kNeeded) {
    return absl::InvalidArgumentError(absl::StrCat(
        "/proc/stat: the cpu line has ", words.size() - 1, " fields; at least 7 are needed"));
  }
  std::vector<uint64_t> v;
  for (size_t i = 1; i < words.size() && i <= 8; ++i) {
    uint64_t x = 0;
    if (!absl::SimpleAtoi(words[i], &x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("/proc/stat: cpu field ", i, " \"", words[i], "\" is not a number"));
    }
    v.push_back(x);
  }
  CpuTimes t;
  for (uint64_t x : v) t.total += x;  // user..steal; guest is inside user
  t.idle = v[3] + v[4];
  t.kernel = v[2] + v[5] + v[6];
  return t;
}

absl::StatusOr<CpuTimes> ReadCpuTimes() {
  std::ifstream in("/proc/stat");
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::UnavailableError("cannot read /proc/stat");
  }
  return ParseProcStat(line);
}

CpuShare ShareBetween(const CpuTimes& before, const CpuTimes& after) {
  if (after.total <= before.total) return {};
  const double total = static_cast<double>(after.total - before.total);
  const double idle = after.idle >= before.idle ? static_cast<double>(after.idle - before.idle) : 0;
  const double kernel =
      after.kernel >= before.kernel ? static_cast<double>(after.kernel - before.kernel) : 0;
  CpuShare share;
  share.busy = std::min(1.0, std::max(0.0, 1.0 - idle / total));
  share.kernel = std::min(1.0, kernel / total);
  return share;
}

}  // namespace kvrail::bench
