// What the planner answers (CACHEPD §6): one decode rank's route, its targets, and a prefill
// rank's decision on a registration.
#ifndef KVRAIL_CONTROL_PLAN_ROUTE_H_
#define KVRAIL_CONTROL_PLAN_ROUTE_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "control/plan/fragment.h"
#include "control/plan/owner_filter.h"

namespace kvrail::plan {

// The fragments one prefill rank sends to one decode rank, in the reference's order: by
// segment pair (group spec order, then field_id), then by partition part (§6.3).
struct SourceFragments {
  int prefill_rank = 0;
  std::vector<Fragment> fragments;
  // One decision per sharded group of the prefill contract, in group spec order (§12.8): the
  // filter (p mod k, k) for a group this rank's fragments name (it sends only the blocks it
  // owns), "none" for the others. Empty when no group is sharded.
  std::vector<GroupOwnerFilter> owner_filters;
};

// `plan_for_decode_rank(d)` (§6.1): the prefill ranks whose data decode rank d needs.
struct Route {
  // True when P == D and the planner holds every field: the single source is prefill rank d,
  // with no fragments, and every field of every group is copied whole (§6.6, §6.9).
  bool whole_field_copy = false;
  // Ascending prefill_rank. Each entry has at least one fragment unless whole_field_copy.
  std::vector<SourceFragments> sources;

  // The source's entry, or nullptr when `prefill_rank` sends nothing to this decode rank.
  const SourceFragments* Find(int prefill_rank) const;
  // E_d: the prefill ranks of `sources`, ascending.
  std::vector<int> PrefillRanks() const;
};

// Whom decode rank d talks to (§6.5). All three lists are ascending.
struct DecodeTargets {
  std::vector<int> expected_prefill_ranks;  // E_d: the ranks whose Success the decode needs
  std::vector<int> dummy_tp_ranks;          // Z_d: rendezvous-only ranks; empty unless d == 0
  std::vector<int> target_tp_ranks;         // T_d = E_d ∪ Z_d: registered and pre-allocated to
};

bool operator==(const DecodeTargets& a, const DecodeTargets& b);

// What prefill rank p does with decode rank d's registration (§3.2.2, §6.8).
struct RegistrationOutcome {
  enum class Kind {
    kSend,    // a data registration: p is a source of d's route
    kDummy,   // d == 0 and p serves no decode rank: rendezvous only
    kReject,  // anything else, including a route the planner cannot compute
  };
  Kind kind = Kind::kReject;
  // kSend: the fragments p sends to d; empty when the route is a whole-field copy. Else empty.
  std::vector<Fragment> fragments;
  // kSend: S_p, the decode ranks p serves (its pre-allocations per room). kDummy: {0}.
  // kReject: empty.
  std::vector<int> expected_decode_ranks;
  // kSend: route[p]'s owner-filter decisions (§12.8). kDummy: every sharded group's decision
  // "none" (§12.7). kReject: empty. Empty whenever no group is sharded.
  std::vector<GroupOwnerFilter> owner_filters;
  // kReject: why. OK otherwise.
  absl::Status error;
};

// The senders of a route's byte ranges, for ValidateOwnerCoverage. A whole-field route has no
// fragments and gives none (a sharded group always routes by fragments, §12.6). The senders point
// into `route`, which must outlive them.
std::vector<RangeSender> RangeSendersOf(const Route& route);

// "send", "dummy" or "reject", as the vectors spell outcomes.
absl::string_view OutcomeName(RegistrationOutcome::Kind kind);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_ROUTE_H_
