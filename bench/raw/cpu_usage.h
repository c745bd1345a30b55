// How busy the machine's CPUs were during a measurement, from /proc/stat: the evidence for
// "the transport caps it" when two tools both saturate the cores, most of it in the kernel's
// tcp path (which Linux accounts partly to softirq, not to either process).
#ifndef KVRAIL_BENCH_RAW_CPU_USAGE_H_
#define KVRAIL_BENCH_RAW_CPU_USAGE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::bench {

// The aggregate "cpu" line of /proc/stat, in clock ticks summed over every CPU.
struct CpuTimes {
  uint64_t total = 0;   // every field but guest time (already counted in user and nice)
  uint64_t idle = 0;    // idle + iowait
  uint64_t kernel = 0;  // system + irq + softirq
};

// Parses the first line of /proc/stat ("cpu  user nice system idle iowait irq softirq steal
// ..."; older kernels stop after softirq). InvalidArgument naming what is missing otherwise.
absl::StatusOr<CpuTimes> ParseProcStat(absl::string_view text);

// Reads /proc/stat now.
absl::StatusOr<CpuTimes> ReadCpuTimes();

// The share of all CPU time between two readings: busy = not idle, kernel = system, irq and
// softirq; both in [0, 1]. Zero when no tick passed.
struct CpuShare {
  double busy = 0;
  double kernel = 0;
};
CpuShare ShareBetween(const CpuTimes& before, const CpuTimes& after);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_CPU_USAGE_H_
