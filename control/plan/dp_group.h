// Which prefill DP group serves a room (CACHEPD §1.3, step D4): room mod prefill_dp_size, on
// both sides; the prefill ranks of that group are the ones that ran the request. An engine may
// name the group it expects (Expect.dp_group) so that a mismatch between its router and CachePD
// fails the room, naming both, instead of waiting on ranks that never got the request.
#ifndef KVRAIL_CONTROL_PLAN_DP_GROUP_H_
#define KVRAIL_CONTROL_PLAN_DP_GROUP_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"

namespace kvrail::plan {

// room mod prefill_dp_size. InvalidArgument when prefill_dp_size is below 1, or when
// `requested` is given and is not that group ("Expect.dp_group 1 is not where CachePD routes
// room 6: room mod prefill_dp_size (4) = 2 (CACHEPD §1.3, D4)"), or lies outside
// [0, prefill_dp_size) (which it then names).
absl::StatusOr<int> DpGroupOf(uint64_t room, int prefill_dp_size, std::optional<int> requested);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_DP_GROUP_H_
