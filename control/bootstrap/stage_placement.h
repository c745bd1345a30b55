// The stage placement of a PUT /route body (CACHEPD §12.3 steps 3 to 5): `pp_size` and
// `cache_fields_by_stage`, the field ids each pipeline stage of the prefill node holds.
//
// A 2026-09 registration always carries both members; a snapshot-era one carries neither
// (a Python snapshot prefill), or both when it came from a kvrail snapshot-era prefill with
// pp_size > 1. Whenever either member is present, both are read as the 2026-09 reference
// reads them, in its order, with its refusals (500, kReferenceRaises):
//   3. cache_fields_by_stage is present, a list whose elements are all lists;
//   4. it covers the contract's fields exactly once: at least one stage, every id a string,
//      no id twice, the set of ids that of plan.fields (a stage may be empty here; planning
//      refuses it later, §12.6);
//   5. pp_size is present and equals the number of stages.
// pp_size is read as Python's int() reads it, except that kvrail refuses a bool or a float
// (400, kBadRequest) where int() would read true as 1 and truncate 2.5, as the registration's
// other integers (registration.h); a JSON integer or a string holding one is read. Then
// kvrail's bound: at most plan::kMaxTpSize stages (400).
#ifndef KVRAIL_CONTROL_BOOTSTRAP_STAGE_PLACEMENT_H_
#define KVRAIL_CONTROL_BOOTSTRAP_STAGE_PLACEMENT_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "control/layout/contract.h"
#include "control/plan/pipeline.h"

namespace kvrail::bootstrap {

// Reads the placement of `body` (a JSON object) against `contract`, the registration's layout.
// nullopt when the body carries neither member (or both null) and `required_because` is
// empty; when it is not empty, the members are required and a missing one is refused with
// that reason appended (e.g. "the contract is in the 2026-09 form"). Errors name the member
// and the rule, in one line, and carry their refusal (refusal.h).
absl::StatusOr<std::optional<plan::PipelineLayout>> ReadStagePlacement(
    const nlohmann::json& body, const layout::Contract& contract,
    const std::string& required_because);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_STAGE_PLACEMENT_H_
