#include "control/plan/dp_group.h"

#include "absl/strings/str_format.h"

namespace kvrail::plan {

absl::StatusOr<int> DpGroupOf(uint64_t room, int prefill_dp_size, std::optional<int> requested) {
  if (prefill_dp_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prefill_dp_size %d: a prefill node has at least one DP group", prefill_dp_size));
  }
  const int group = static_cast<int>(room % static_cast<uint64_t>(prefill_dp_size));
  if (!requested || *requested == group) return group;
  if (*requested < 0 || *requested >= prefill_dp_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("Expect.dp_group %d: the prefill node has %d DP group(s), numbered from 0",
                        *requested, prefill_dp_size));
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "Expect.dp_group %d is not where CachePD routes room %d: room mod prefill_dp_size (%d) = %d "
      "(CACHEPD §1.3, D4)",
      *requested, room, prefill_dp_size, group));
}

}  // namespace kvrail::plan
