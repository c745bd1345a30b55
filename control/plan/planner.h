// The route planner (CACHEPD §6, the reference's `CacheTransferPlanner`): from two contracts and
// two TP sizes, which prefill rank copies which bytes of which field to which decode rank.
//
// Both roles build one:
//   * the decode, with (P, D, the prefill contract from the bootstrap, its own contract), to
//     find the prefill ranks it registers with and waits for (TargetsFor);
//   * the prefill, with (its own P, the registration's D, its own contract, the registration's
//     contract), to decide on a registration and find its fragments (OnRegistration).
// The planner reads shapes, dtypes, partitions and group specs only; plan offsets and strides
// belong to the address resolver (§6.9).
//
// Plan once per registration: Create does all validation and computes every S_p and E_d, which
// allocates; the accessors afterwards are cheap. A Planner owns copies of what it needs, so the
// contracts it was built from need not outlive it. It is immutable and safe to share.
#ifndef KVRAIL_CONTROL_PLAN_PLANNER_H_
#define KVRAIL_CONTROL_PLAN_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "control/layout/contract.h"
#include "control/plan/fragment.h"
#include "control/plan/owner_filter.h"
#include "control/plan/rank_intervals.h"
#include "control/plan/route.h"
#include "control/plan/stage_filter.h"

namespace kvrail::plan {

// TP sizes the planner accepts: 1..kMaxTpSize on each side (§6.1, the reference's
// MAX_CACHE_TP_SIZE).
inline constexpr int kMaxTpSize = 1024;

class Planner {
 public:
  // Runs the construction steps of §6.1 in order:
  //   1. 1 <= prefill_tp, decode_tp <= kMaxTpSize;
  //   2. CheckPeerContracts(prefill, decode) (§4.5);
  //   3. segment pairs: for each group spec in order, each field of the group sorted by
  //      field_id, partitioned as the PREFILL contract says;
  //   4. per pair: with P == D, equal local shape and payload bytes; when partitioned, a valid
  //      shard mapping (§6.2) on the prefill side with TP P and the decode side with TP D;
  //   5. S_p for every prefill rank p (and E_d for every decode rank d).
  // `stage`, when given, restricts steps 3 to 5 to the fields a prefill pipeline stage holds
  // (§12.6; see pipeline.h). An id that names no field of `prefill` fails ("stage placement
  // contains unknown cache fields"); a filter naming every field is the same as none. A filter
  // naming only some fields turns off the whole-field copy of P == D, because the stage must
  // not send fields it does not hold: its route is then the explicit fragments of §6.3. A
  // filter naming no field leaves nothing to route: every decode rank "has no source fragments".
  // Page-sharded groups (§12.8) are the prefill contract's group specs with shard_count k > 1.
  // Create refuses a decode group spec with shard_count != 1, P mod k != 0, and a partitioned
  // field in a sharded group. A sharded group's (replicated) field is sent by every rank of
  // the subgroup [r - r mod k, r - r mod k + k) around its §6.3 source r = floor(d * P / D),
  // each with its owner filter; any sharded group turns off the whole-field copy.
  // Errors: the peer check's incompatible-peer error as is; every other refusal is
  // unsupported-layout and names the field or group, the TP size or the rank, and the rule.
  static absl::StatusOr<Planner> Create(int prefill_tp, int decode_tp,
                                        const layout::Contract& prefill,
                                        const layout::Contract& decode,
                                        const StageFilter* stage = nullptr);

  int prefill_tp_size() const { return prefill_tp_; }
  int decode_tp_size() const { return decode_tp_; }
  // True when every route is a whole-field copy from the same-index rank (§6.6, §12.6): P == D,
  // no stage filter leaves fields out, and no group is sharded.
  bool whole_field_copy() const { return whole_field_copy_; }
  // The prefill contract's sharded groups (shard_count > 1), in group spec order (§12.8).
  const std::vector<std::string>& sharded_group_ids() const { return sharded_group_ids_; }

  // `plan_for_decode_rank(d)` (§6.1). Whole-field copy: one source, prefill rank d, with no
  // fragments. Otherwise the fragments of §6.3 grouped by source rank, ascending, each list in
  // segment-pair order then part order. Errors (unsupported-layout): d outside 0..D-1; a route
  // with no source at all ("has no source fragments"), which happens when nothing is routed
  // (a contract or stage without fields). Allocates the route.
  absl::StatusOr<Route> PlanForDecodeRank(int d) const;

  // S_p (§6.1 step 5): the decode ranks prefill rank p sends to, ascending; empty for an idle
  // (dummy) rank and for p outside 0..P-1.
  const std::vector<int>& DecodeRanksServedBy(int p) const;

  // §6.5 for decode rank d: E_d (the sources of its route), Z_d (for d == 0 only, the prefill
  // ranks with an empty S_p) and T_d, their sorted union. Fails exactly when
  // PlanForDecodeRank(d) fails, with the same error.
  absl::StatusOr<DecodeTargets> TargetsFor(int d) const;

  // Prefill rank p's decision on decode rank d's registration (§3.2.2, §6.8):
  //   * kSend when p is a source of d's route: fragments = route[p], expected = S_p, and
  //     route[p]'s owner-filter decisions;
  //   * else kDummy when d == 0 and S_p is empty: no fragments, expected = {0}, every sharded
  //     group's decision "none" (§12.7);
  //   * else kReject: the route's own error when PlanForDecodeRank(d) fails, otherwise
  //     "targets the wrong prefill TP rank" (unsupported-layout); also for p outside 0..P-1.
  RegistrationOutcome OnRegistration(int p, int d) const;

  // Pre-allocations prefill rank p needs per room before it is Bootstrapped (§6.5): |S_p|, or
  // 1 (the dummy pre-allocation from decode rank 0) when S_p is empty. 0 for p out of range.
  int RequiredPreallocations(int p) const;
  // Success messages decode rank d needs per room (§6.5): |E_d|; 0 when d's route fails or d
  // is out of range.
  int RequiredCompletions(int d) const;

 private:
  // One segment pair of §6.1 step 3, reduced to the numbers §6.3 needs.
  struct Segment {
    std::string group_id;
    std::string field_id;
    int64_t prefill_payload_bytes = 0;
    int64_t decode_payload_bytes = 0;
    // Set for a partitioned field.
    std::optional<ShardMap> prefill_shards;
    std::optional<ShardMap> decode_shards;
    int64_t inner_bytes = 0;     // prod(prefill_shape[axis+1:]) * element size
    int64_t rows = 1;            // prod(prefill_shape[:axis])
    int64_t src_row_stride = 0;  // prefill_shape[axis] * inner_bytes
    int64_t dst_row_stride = 0;  // decode_shape[axis] * inner_bytes
    int owners = 1;              // the group's shard_count: > 1 when page-sharded (§12.8)
  };

  Planner() = default;

  // Calls visit(prefill_rank, segment, fragment) for every fragment of decode rank d's route
  // (P != D or a partial stage), in segment-pair order, then ascending prefill rank, then part
  // order. A sharded group's fragment is visited once per rank of its owner subgroup,
  // ascending. The fragment's group_id and field_id are left empty: callers that keep
  // fragments take them from the segment. No allocation.
  template <typename Visit>
  void ForEachFragment(int d, Visit&& visit) const;

  absl::Status CheckDecodeRank(int d) const;

  // Prefill rank p's owner-filter decisions for decode rank d (§12.8): one per sharded group,
  // in group spec order, the filter (p mod k, k) when p sends a fragment of the group to d,
  // "none" otherwise.
  std::vector<GroupOwnerFilter> OwnerFiltersFor(int p, int d) const;
  // Every sharded group's decision "none": a dummy's (§12.7).
  std::vector<GroupOwnerFilter> NoOwnerFilters() const;

  int prefill_tp_ = 1;
  int decode_tp_ = 1;
  bool whole_field_copy_ = false;
  std::vector<Segment> segments_;
  std::vector<std::string> sharded_group_ids_;
  std::vector<std::vector<int>> served_by_prefill_rank_;  // S_p
  std::vector<std::vector<int>> sources_of_decode_rank_;  // E_d; empty when the route fails
};

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_PLANNER_H_
