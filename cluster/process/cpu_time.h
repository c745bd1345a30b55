// The CPU time a process has used, from /proc/<pid>/stat: what `kvrail bench kv` charges each
// side's sidecars for a room (CPU seconds per GiB moved).
#ifndef KVRAIL_CLUSTER_PROCESS_CPU_TIME_H_
#define KVRAIL_CLUSTER_PROCESS_CPU_TIME_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::process {

// User plus system time, in clock ticks, of every thread of the process whose /proc/<pid>/stat
// is `stat` (fields 14 and 15; the command name in parentheses may hold spaces or parentheses
// itself). InvalidArgument naming what is missing otherwise.
absl::StatusOr<uint64_t> ParseCpuTicks(absl::string_view stat);

// The CPU seconds process `pid` has used so far (its threads, not its children). NotFound when
// it is gone.
absl::StatusOr<double> CpuSeconds(pid_t pid);

}  // namespace kvrail::process

#endif  // KVRAIL_CLUSTER_PROCESS_CPU_TIME_H_
