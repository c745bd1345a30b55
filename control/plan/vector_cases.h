// Test support: reads planner.json and descriptors.json cases (tests/data/cachepd/VECTORS.md),
// and the contracts and owner filters of the 2026-09 vectors (r2/), into kvrail types.
#ifndef KVRAIL_CONTROL_PLAN_VECTOR_CASES_H_
#define KVRAIL_CONTROL_PLAN_VECTOR_CASES_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "control/layout/contract.h"
#include "control/plan/fragment.h"
#include "control/plan/owner_filter.h"
#include "engine/base/error.h"

namespace kvrail::plan::testing {

// planner.json's cases, loaded once.
const nlohmann::json& PlannerCases();
// descriptors.json's cases, loaded once.
const nlohmann::json& DescriptorCases();

// One planner.json case with both contracts parsed. Aborts the test binary when a contract
// does not parse: every vector contract is canonical, so that is a build or codec mistake.
struct PlannerCase {
  std::string name;
  int prefill_tp = 0;
  int decode_tp = 0;
  layout::Contract prefill;
  layout::Contract decode;
  const nlohmann::json* result = nullptr;
};
PlannerCase ReadPlannerCase(const nlohmann::json& entry);

// The kvrail category for an error the reference raised in the planner or the registration
// handler: UnsupportedPDLayoutError and the registration's plain ValueError ("targets the
// wrong Prefill TP rank") are unsupported-layout; CacheContractError (the peer check) is
// incompatible-peer.
std::optional<ErrorCategory> CategoryOfReferenceError(const nlohmann::json& error);

// A contract of an r2/ vector (a 2026-09 wire, CACHEPD §12.1), its shard_count and replayable
// members included. Aborts as ReadPlannerCase does.
layout::Contract ReadR2Contract(const std::string& name, const nlohmann::json& wire);

// {"<group_id>": {"owner_rank", "owner_count"} or null, ...} as dcp_r2.json spells a rank's
// owner-filter decisions, in the object's order.
std::vector<GroupOwnerFilter> OwnerFiltersFromJson(const nlohmann::json& by_group);

Fragment FragmentFromJson(const nlohmann::json& json);
std::vector<Fragment> FragmentsFromJson(const nlohmann::json& json);
std::vector<int> IntsFromJson(const nlohmann::json& json);

// The field ids of `contract`, in plan order.
std::vector<std::string> FieldIds(const layout::Contract& contract);

}  // namespace kvrail::plan::testing

#endif  // KVRAIL_CONTROL_PLAN_VECTOR_CASES_H_
