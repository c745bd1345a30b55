// A `kvrail top` frame's numbers as JSON (`kvrail top --once --json`), for scripts.
//
// {"time": ..., "interval_seconds": ..., "totals": {...}, "endpoints": [{"endpoint", "up",
// "error", "kind", "role", "rank", "session", "has_rates", "rooms_per_second",
// "bytes_per_second", "peers": [{"peer", "bytes_per_second"}], "p99_seconds" (null: no room
// ended), "failures", "failures_per_second", "last_failure" (null or {"cause", "room",
// "reason", "unix_seconds"}), "bytes_in_flight", "requests_per_second", "registered_ranks"}]}
#ifndef KVRAIL_TOOLS_TOP_FRAME_JSON_H_
#define KVRAIL_TOOLS_TOP_FRAME_JSON_H_

#include <string>

#include "tools/top/render.h"
#include "tools/top/view_model.h"

namespace kvrail::top {

// One line of JSON; text that is not UTF-8 (a peer's reason) has its bad bytes replaced.
std::string FrameJson(const TopModel& model, const FrameOptions& options);

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_FRAME_JSON_H_
