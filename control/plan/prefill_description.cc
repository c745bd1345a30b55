#include "control/plan/prefill_description.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

using nlohmann::json;

absl::Status DescriptionError(absl::string_view member, absl::string_view problem,
                              absl::string_view section = "CACHEPD §2.3, §10.5") {
  return MakeError(
      ErrorCategory::kUnsupportedLayout,
      absl::StrCat("bootstrap description ", member, ": ", problem, " (", section, ")"));
}

// A positive size: a JSON integer, or a string holding one (whitespace trimmed), as §10.5.
absl::StatusOr<int> ReadSize(const json& body, const char* member, std::optional<int> fallback) {
  auto it = body.find(member);
  if (it == body.end() || it->is_null()) {
    if (fallback.has_value()) return *fallback;
    return DescriptionError(member, "is missing or null: the prefill has not registered yet");
  }
  int64_t value = 0;
  if (it->is_number_integer()) {
    value = it->is_number_unsigned()
                ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), uint64_t{1} << 40))
                : it->get<int64_t>();
  } else if (it->is_string()) {
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(it->get<std::string>()), &value)) {
      return DescriptionError(member,
                              absl::StrCat("\"", it->get<std::string>(), "\" is not an integer"));
    }
  } else {
    return DescriptionError(member, absl::StrCat("must be an integer, got ", it->dump()));
  }
  if (value < 1 || value > 1 << 20) {
    return DescriptionError(member, absl::StrCat("must be positive, got ", value));
  }
  return static_cast<int>(value);
}

}  // namespace

absl::StatusOr<PrefillDescription> ParsePrefillDescription(absl::string_view body_text) {
  json body = json::parse(body_text.begin(), body_text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return DescriptionError("body", "is not a JSON object");
  }
  PrefillDescription out;
  auto layout = body.find("cache_layout");
  if (layout == body.end() || layout->is_null()) {
    return DescriptionError("cache_layout",
                            "is missing: cache-transfer decode connected to a prefill without "
                            "paged-cache transfer");
  }
  if (!layout->is_string()) return DescriptionError("cache_layout", "must be a string");
  const std::string& wire = layout->get_ref<const std::string&>();
  for (unsigned char c : wire) {
    if (c >= 0x80) return DescriptionError("cache_layout", "must be ASCII");
  }
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(wire);
  if (!contract.ok()) return AddContext(contract.status(), "bootstrap description cache_layout");
  out.contract = *std::move(contract);
  out.revision = out.contract.revision;
  KVRAIL_ASSIGN_OR_RETURN(out.world_size, ReadSize(body, "prefill_tp_size", std::nullopt));
  KVRAIL_ASSIGN_OR_RETURN(out.dp_size, ReadSize(body, "prefill_dp_size", std::nullopt));
  // §12.5: prefill_pp_size defaults to 1 (a snapshot server's answer has none).
  KVRAIL_ASSIGN_OR_RETURN(out.pp_size, ReadSize(body, "prefill_pp_size", 1));
  // The reference computes P = prefill_tp_size // (dp * pp), flooring (§12.5); kvrail requires
  // the division to be exact, since a remainder means ranks the route would miss or invent.
  KVRAIL_ASSIGN_OR_RETURN(out.stage_tp_size, StageTpSize(out.world_size, out.dp_size, out.pp_size));

  auto stages = body.find("cache_fields_by_stage");
  if (stages == body.end() || stages->is_null()) {
    // §12.5 SHOULD: no placement is one stage holding every field. The newer reference decode
    // fails the room instead; a snapshot server never sends the member (§2.2).
    if (out.pp_size != 1) {
      return DescriptionError("cache_fields_by_stage",
                              absl::StrCat("is missing or null, which means one stage holding "
                                           "every field, but prefill_pp_size is ",
                                           out.pp_size),
                              "CACHEPD §12.5");
    }
    out.pipeline = PipelineLayout::SingleStage(out.contract);
  } else {
    if (!stages->is_array()) return DescriptionError("cache_fields_by_stage", "must be a list");
    out.pipeline.pp_size = out.pp_size;
    for (const json& stage : *stages) {
      if (!stage.is_array()) {
        return DescriptionError("cache_fields_by_stage", "each stage must be a list of ids");
      }
      std::vector<std::string> ids;
      for (const json& id : stage) {
        if (!id.is_string()) {
          return DescriptionError("cache_fields_by_stage", "field ids must be strings");
        }
        ids.push_back(id.get<std::string>());
      }
      out.pipeline.fields_by_stage.push_back(std::move(ids));
    }
    KVRAIL_RETURN_IF_ERROR(ValidatePipelineLayout(out.pipeline, out.contract));
  }

  return out;
}

}  // namespace kvrail::plan
