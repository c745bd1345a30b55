#include "tests/fuzz/planner_cases.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "control/plan/vector_cases.h"
#include "tests/fuzz/check.h"

namespace kvrail::fuzz {
namespace {

void CheckFits(const layout::Contract& contract, const std::string& what) {
  const absl::Status fits = layout::CheckArenaFits(contract);
  Check(fits.ok(),
        [&] { return absl::StrCat(what, " does not fit its arena: ", fits.ToString()); });
}

}  // namespace

PlannerCase LoadPlannerCase(absl::string_view name) {
  // The vectors are read as every planner test reads them (control/plan/vector_cases.h).
  for (const nlohmann::json& entry : plan::testing::PlannerCases()) {
    if (entry.at("name").get<std::string>() != name) continue;
    plan::testing::PlannerCase read = plan::testing::ReadPlannerCase(entry);
    PlannerCase c;
    c.name = std::move(read.name);
    c.prefill_tp_size = read.prefill_tp;
    c.decode_tp_size = read.decode_tp;
    c.prefill = std::move(read.prefill);
    c.decode = std::move(read.decode);
    CheckFits(c.prefill, absl::StrCat("planner.json ", name, " prefill contract"));
    CheckFits(c.decode, absl::StrCat("planner.json ", name, " decode contract"));
    c.decode_wire = *layout::SerializeContract(c.decode);
    return c;
  }
  Check(false, [&] { return absl::StrCat("planner.json has no case ", name); });
  return {};
}

PlannerCase LoadShardedPlannerCase(const ShardedPlanCase& sharded) {
  PlannerCase c = LoadPlannerCase(sharded.name);
  c.name = absl::StrCat(sharded.name, "_dcp", sharded.shard_count);
  for (layout::GroupSpec& spec : c.prefill.group_specs) spec.shard_count = sharded.shard_count;
  return c;
}

}  // namespace kvrail::fuzz
