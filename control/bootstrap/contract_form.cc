#include "control/bootstrap/contract_form.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::ordered_json;

absl::Status FormError(absl::string_view member, absl::string_view problem) {
  return MakeError(ErrorCategory::kInvalidContract,
                   absl::StrCat("contract ", member, ": ", problem, " (CACHEPD §12.1)"));
}

}  // namespace

absl::StatusOr<std::string> SerializeContractIn(const layout::Contract& contract,
                                                layout::Revision revision) {
  if (revision == layout::Revision::kSnapshot) {
    for (size_t i = 0; i < contract.group_specs.size(); ++i) {
      if (contract.group_specs[i].shard_count != 1) {
        return FormError(absl::StrCat("group_specs[", i, "].shard_count"),
                         absl::StrCat(contract.group_specs[i].shard_count,
                                      " cannot be written in the snapshot revision's form, "
                                      "which has no sharded groups"));
      }
    }
    if (contract.plan.resident_block_bytes.has_value()) {
      return FormError("plan.resident_block_bytes",
                       "cannot be written in the snapshot revision's form");
    }
    return layout::SerializeContract(contract);
  }
  // TEMPORARY (see the header): the snapshot's canonical wire with 2026-09's members put in
  // their places (§12.1's member order).
  KVRAIL_ASSIGN_OR_RETURN(std::string snapshot, layout::SerializeContract(contract));
  const ordered_json root = ordered_json::parse(snapshot);
  ordered_json out = ordered_json::object();
  for (const auto& [key, value] : root.items()) {
    if (key == "plan") {
      ordered_json plan = value;
      plan["resident_block_bytes"] = contract.plan.resident_block_bytes
                                         ? ordered_json(*contract.plan.resident_block_bytes)
                                         : ordered_json(nullptr);
      out["plan"] = std::move(plan);
    } else if (key == "group_specs") {
      ordered_json specs = ordered_json::array();
      for (size_t g = 0; g < value.size(); ++g) {
        ordered_json spec = ordered_json::object();
        for (const auto& [member, member_value] : value[g].items()) {
          spec[member] = member_value;
          if (member == "sliding_window_tokens") {
            spec["replayable"] = contract.group_specs[g].replayable;
          }
        }
        spec["shard_count"] = contract.group_specs[g].shard_count;
        specs.push_back(std::move(spec));
      }
      out["group_specs"] = std::move(specs);
    } else {
      out[key] = value;
    }
  }
  return out.dump(-1, ' ', /*ensure_ascii=*/true);
}

}  // namespace kvrail::bootstrap
