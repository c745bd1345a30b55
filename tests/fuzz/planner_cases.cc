#include "tests/fuzz/planner_cases.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/fuzz/check.h"
#include "tests/support/vectors.h"

namespace kvrail::fuzz {
namespace {

layout::Contract ParseFitting(const std::string& wire, const std::string& what) {
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(wire);
  Check(contract.ok(),
        [&] { return absl::StrCat(what, " does not parse: ", contract.status().ToString()); });
  const absl::Status fits = layout::CheckArenaFits(*contract);
  Check(fits.ok(),
        [&] { return absl::StrCat(what, " does not fit its arena: ", fits.ToString()); });
  return *std::move(contract);
}

}  // namespace

PlannerCase LoadPlannerCase(absl::string_view name) {
  static const nlohmann::json* const vectors =
      new nlohmann::json(kvrail::testing::LoadVectors("planner.json"));
  for (const nlohmann::json& entry : vectors->at("cases")) {
    if (entry.at("name").get<std::string>() != name) continue;
    PlannerCase c;
    c.name = std::string(name);
    c.prefill_tp_size = entry.at("prefill_tp_size").get<int>();
    c.decode_tp_size = entry.at("decode_tp_size").get<int>();
    c.prefill = ParseFitting(entry.at("prefill_contract").get<std::string>(),
                             absl::StrCat("planner.json ", name, " prefill contract"));
    c.decode = ParseFitting(entry.at("decode_contract").get<std::string>(),
                            absl::StrCat("planner.json ", name, " decode contract"));
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
