// The metrics endpoints a registry lists (pure): the values under /kvrail/v1/metrics/ that
// sidecars publish, leased, with --registry and --metrics-port (control/registry/keys.h:
// {"url": "http://host:port/metrics", "role": ..., "rank": N, "session": ...}), as targets.
#ifndef KVRAIL_TOOLS_TOP_REGISTRY_TARGETS_H_
#define KVRAIL_TOOLS_TOP_REGISTRY_TARGETS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/top/target.h"

namespace kvrail::top {

struct ListedTarget {
  std::string key;                // the entry's key in the registry
  absl::StatusOr<Target> target;  // named "host:port"; or why the entry is unusable
};

// One per (key, value), in the order given. An entry that is not such an object, or whose url
// is not http://host:port/path, is an error naming its key and the rule.
std::vector<ListedTarget> TargetsFromMetricsEntries(
    const std::vector<std::pair<std::string, std::string>>& entries);

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_REGISTRY_TARGETS_H_
