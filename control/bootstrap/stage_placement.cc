#include "control/bootstrap/stage_placement.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/refusal.h"
#include "control/wire/python_int.h"
#include "engine/base/error.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::json;

constexpr char kStages[] = "cache_fields_by_stage";
constexpr char kPpSize[] = "pp_size";

absl::Status Raises(absl::string_view member, absl::string_view problem) {
  return Refuse(Refusal::kReferenceRaises,
                absl::StrCat("registration ", member, ": ", problem, " (CACHEPD §12.3)"));
}

absl::Status BadRequest(absl::string_view member, absl::string_view problem) {
  return Refuse(Refusal::kBadRequest,
                absl::StrCat("registration ", member, ": ", problem, " (CACHEPD §12.3)"));
}

std::string Quote(const json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  if (text.size() > 64) text = absl::StrCat(text.substr(0, 61), "...");
  return text;
}

const json* Find(const json& body, const char* member) {
  auto it = body.find(member);
  return it == body.end() ? nullptr : &*it;
}

// Step 4: every field of `contract` exactly once, nothing else.
absl::Status CheckCoverage(const std::vector<std::vector<std::string>>& stages,
                           const layout::Contract& contract) {
  constexpr absl::string_view kRule =
      "cache stage placement must cover every logical field exactly once";
  if (stages.empty()) return Raises(kStages, absl::StrCat(kRule, ": it has no stage"));
  std::set<std::string> seen;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (const std::string& id : stages[s]) {
      if (!seen.insert(id).second) {
        return Raises(kStages, absl::StrCat(kRule, ": field '", id, "' appears twice"));
      }
      if (contract.FindField(id) == nullptr) {
        return Raises(kStages, absl::StrCat(kRule, ": stage ", s, " names '", id,
                                            "', which is not a field of cache_layout"));
      }
    }
  }
  for (const layout::FieldLayout& field : contract.plan.fields) {
    if (seen.count(field.field_id) == 0) {
      return Raises(kStages, absl::StrCat(kRule, ": field '", field.field_id, "' is in no stage"));
    }
  }
  return absl::OkStatus();
}

// Step 5: int(pp_size), with kvrail's refusal of bools and floats.
absl::StatusOr<int64_t> ReadPpSize(const json& body, const std::string& required_because) {
  const json* value = Find(body, kPpSize);
  if (value == nullptr) {
    return Raises(kPpSize, absl::StrCat("is missing (KeyError): ",
                                        required_because.empty() ? "cache_fields_by_stage is given"
                                                                 : required_because));
  }
  if (value->is_boolean() || value->is_number_float()) {
    return BadRequest(kPpSize, absl::StrCat("must be an integer, got ", Quote(*value)));
  }
  if (value->is_number_unsigned()) {
    return static_cast<int64_t>(
        std::min<uint64_t>(value->get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  }
  if (value->is_number_integer()) return value->get<int64_t>();
  if (value->is_string()) {
    absl::StatusOr<int64_t> parsed = wire::ParsePythonInt(
        value->get_ref<const std::string&>(), std::numeric_limits<int64_t>::min(),
        std::numeric_limits<int64_t>::max(), kPpSize);
    if (parsed.ok()) return *parsed;
  }
  return Raises(kPpSize, absl::StrCat("int() cannot read ", Quote(*value)));
}

}  // namespace

absl::StatusOr<std::optional<plan::PipelineLayout>> ReadStagePlacement(
    const json& body, const layout::Contract& contract, const std::string& required_because) {
  const json* stages = Find(body, kStages);
  const json* pp_size = Find(body, kPpSize);
  const bool absent =
      (stages == nullptr || stages->is_null()) && (pp_size == nullptr || pp_size->is_null());
  if (absent && required_because.empty()) return std::nullopt;
  // 3. Present, and a list of lists.
  if (stages == nullptr) {
    return Raises(kStages,
                  absl::StrCat("is missing (KeyError): ",
                               required_because.empty() ? "pp_size is given" : required_because));
  }
  constexpr absl::string_view kExplicit = "CachePD requires explicit stage field placement";
  if (!stages->is_array()) {
    return Raises(kStages, absl::StrCat(kExplicit, ": must be a list of lists of field ids, got ",
                                        Quote(*stages)));
  }
  std::vector<std::vector<std::string>> fields_by_stage;
  for (const json& stage : *stages) {
    if (!stage.is_array()) {
      return Raises(kStages, absl::StrCat(kExplicit,
                                          ": every stage must be a list of field ids, "
                                          "got ",
                                          Quote(stage)));
    }
  }
  // 4. Every field exactly once.
  for (const json& stage : *stages) {
    std::vector<std::string> ids;
    for (const json& id : stage) {
      if (!id.is_string()) {
        return Raises(kStages, absl::StrCat("cache stage placement must cover every logical "
                                            "field exactly once: field ids are strings, got ",
                                            Quote(id)));
      }
      ids.push_back(id.get<std::string>());
    }
    fields_by_stage.push_back(std::move(ids));
  }
  KVRAIL_RETURN_IF_ERROR(CheckCoverage(fields_by_stage, contract));
  // 5. pp_size is the number of stages.
  KVRAIL_ASSIGN_OR_RETURN(int64_t pp, ReadPpSize(body, required_because));
  if (pp != static_cast<int64_t>(fields_by_stage.size())) {
    return Raises(kPpSize,
                  absl::StrCat("CachePD placement does not match pipeline stage count: ", pp,
                               " stages declared, ", fields_by_stage.size(), " placed"));
  }
  if (pp > plan::kMaxTpSize) {
    return BadRequest(kPpSize, absl::StrCat(pp, " is outside 1..", plan::kMaxTpSize));
  }
  plan::PipelineLayout placement;
  placement.pp_size = static_cast<int>(pp);
  placement.fields_by_stage = std::move(fields_by_stage);
  return std::optional<plan::PipelineLayout>(std::move(placement));
}

}  // namespace kvrail::bootstrap
