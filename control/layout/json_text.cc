#include "control/layout/json_text.h"

#include <string>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::layout {
namespace {

using nlohmann::json;

// Thrown inside the parser callback to stop at the first strictness violation; caught below
// and never let out of this file.
struct StrictViolation {
  std::string message;
};

// nlohmann prefixes its messages with "[json.exception.parse_error.101] "; drop the tag.
std::string StripExceptionTag(const std::string& what) {
  size_t close = what.find("] ");
  if (what.rfind("[json.exception.", 0) == 0 && close != std::string::npos) {
    return what.substr(close + 2);
  }
  return what;
}

}  // namespace

absl::StatusOr<json> ParseStrictJson(absl::string_view text, size_t max_bytes,
                                     ErrorCategory category, absl::string_view what,
                                     absl::string_view spec_section) {
  auto fail = [&](absl::string_view problem) {
    return MakeError(category, absl::StrCat(what, ": ", problem, " (", spec_section, ")"));
  };
  if (text.empty() || text.size() > max_bytes) {
    return fail(absl::StrFormat("payload must be 1..%d bytes, got %d", max_bytes, text.size()));
  }
  if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xEF &&
      static_cast<unsigned char>(text[1]) == 0xBB && static_cast<unsigned char>(text[2]) == 0xBF) {
    return fail("starts with a UTF-8 byte-order mark; kvrail accepts plain UTF-8 JSON only");
  }
  std::vector<std::unordered_set<std::string>> open_objects;
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth >= kMaxJsonDepth) {
      throw StrictViolation{absl::StrFormat("nesting deeper than %d levels", kMaxJsonDepth)};
    }
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& name = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(name).second) {
          throw StrictViolation{absl::StrCat("member \"", name, "\" appears twice in one object")};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    json value = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                             /*ignore_comments=*/false);
    if (value.is_discarded()) return fail("invalid JSON");
    return value;
  } catch (const StrictViolation& violation) {
    return fail(absl::StrCat("invalid JSON: ", violation.message));
  } catch (const json::exception& error) {
    return fail(absl::StrCat("invalid JSON: ", StripExceptionTag(error.what())));
  }
}

absl::StatusOr<std::string> DumpCanonical(const nlohmann::ordered_json& value,
                                          ErrorCategory category, absl::string_view what) {
  try {
    return value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& error) {
    return MakeError(category,
                     absl::StrCat(what, ": cannot serialise: ", StripExceptionTag(error.what())));
  }
}

}  // namespace kvrail::layout
