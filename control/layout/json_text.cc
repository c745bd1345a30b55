#include "control/layout/json_text.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::layout {
namespace {

using nlohmann::json;

// Thrown inside the parser to stop at the first strictness violation; caught below and never
// let out of this file.
struct StrictViolation {
  std::string message;
};

// nlohmann's SAX events built into a DOM, the way its own DOM parser does, with the strict rules
// checked on the way: a member name repeated within one object is found in the object being
// built (no set of names per object, no copy of each name), and nesting is counted on the stack
// of open values. It replaced json::parse with a callback, whose std::function call per event,
// keep stacks and per-object std::unordered_set of copied names cost about a third of a
// manifest's parse (kvrail bench control parses three manifests per room).
class StrictDomBuilder {
 public:
  explicit StrictDomBuilder(json& root) : root_(root) {}

  bool null() { return Put(json(nullptr)); }
  bool boolean(bool value) { return Put(json(value)); }
  bool number_integer(json::number_integer_t value) { return Put(json(value)); }
  bool number_unsigned(json::number_unsigned_t value) { return Put(json(value)); }
  bool number_float(json::number_float_t value, const json::string_t& /*text*/) {
    return Put(json(value));
  }
  bool string(json::string_t& value) { return Put(json(std::move(value))); }
  bool binary(json::binary_t& value) { return Put(json::binary(std::move(value))); }
  bool start_object(std::size_t /*size*/) { return Open(json::value_t::object); }
  bool start_array(std::size_t /*size*/) { return Open(json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(json::string_t& name) {
    Deep();
    json::object_t& object = open_.back()->get_ref<json::object_t&>();
    auto at = object.lower_bound(name);
    if (at != object.end() && at->first == name) {
      throw StrictViolation{absl::StrCat("member \"", name, "\" appears twice in one object")};
    }
    member_ = &object.emplace_hint(at, std::move(name), nullptr)->second;
    return true;
  }
  // Syntax errors are nlohmann's own exceptions, as json::parse throws them.
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/, const Exception& error) {
    throw error;
  }

 private:
  // A value or name at the depth of open_'s size: refused past kMaxJsonDepth.
  void Deep() const {
    if (open_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      throw StrictViolation{absl::StrFormat("nesting deeper than %d levels", kMaxJsonDepth)};
    }
  }
  // Where the next value goes: the root, the end of the open array, or the member just named.
  json& Place(json value) {
    Deep();
    if (open_.empty()) {
      root_ = std::move(value);
      return root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      json::array_t& array = parent.get_ref<json::array_t&>();
      array.push_back(std::move(value));
      return array.back();
    }
    *member_ = std::move(value);
    return *member_;
  }
  bool Put(json value) {
    Place(std::move(value));
    return true;
  }
  bool Open(json::value_t type) {
    // Only the open value grows; what an array's growth moves is closed already.
    open_.push_back(&Place(json(type)));
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }

  json& root_;
  std::vector<json*> open_;  // the objects and arrays not closed yet, outermost first
  json* member_ = nullptr;   // the member the last key named
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
  try {
    json value;
    StrictDomBuilder builder(value);
    if (!json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                         /*strict=*/true, /*ignore_comments=*/false)) {
      return fail("invalid JSON");
    }
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
