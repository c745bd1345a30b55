// Where a metrics endpoint is, as the operator names it on `kvrail top --endpoints` or a
// registry entry's URL gives it (pure).
#ifndef KVRAIL_TOOLS_TOP_TARGET_H_
#define KVRAIL_TOOLS_TOP_TARGET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::top {

// Where one endpoint serves its metrics.
struct Target {
  std::string name;  // as the operator wrote it, the row's label
  std::string host;
  int port = 0;
  std::string path = "/metrics";
};

// "host:port", "[v6]:port" or "http://host:port[/path]". A bad one is refused naming it and
// the rule, e.g. "endpoint 'node1': expected host:port or http://host:port/path".
absl::StatusOr<Target> ParseTarget(absl::string_view text);

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_TARGET_H_
