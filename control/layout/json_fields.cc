#include "control/layout/json_fields.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvrail::layout {
namespace {

using nlohmann::json;

absl::string_view TypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_float:
      return "a non-integer number";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

absl::Status PathError(ErrorCategory category, absl::string_view path, absl::string_view problem,
                       absl::string_view section) {
  return MakeError(category, absl::StrCat(path, ": ", problem, " (", section, ")"));
}

}  // namespace

std::string IndexPath(absl::string_view path, size_t index) {
  return absl::StrCat(path, "[", index, "]");
}

absl::StatusOr<int64_t> ReadInt(const json& value, absl::string_view path, int64_t min, int64_t max,
                                ErrorCategory category, absl::string_view section) {
  if (!value.is_number_integer()) {
    return PathError(category, path, absl::StrCat("must be a JSON integer, got ", TypeName(value)),
                     section);
  }
  bool in_range;
  int64_t result = 0;
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(max) && static_cast<int64_t>(u) >= min;
    result = static_cast<int64_t>(u);
  } else {
    result = value.get<int64_t>();
    in_range = result >= min && result <= max;
  }
  if (!in_range) {
    return PathError(category, path,
                     absl::StrCat("must be in [", min, ", ", max, "], got ", value.dump()),
                     section);
  }
  return result;
}

absl::StatusOr<JsonObject> JsonObject::Of(const json& value, std::string path,
                                          ErrorCategory category, absl::string_view section) {
  if (!value.is_object()) {
    return PathError(category, path.empty() ? "payload" : path,
                     absl::StrCat("must be a JSON object, got ", TypeName(value)), section);
  }
  return JsonObject(&value, std::move(path), category, section);
}

const json* JsonObject::Find(absl::string_view key) const {
  auto it = value_->find(static_cast<std::string>(key));
  return it == value_->end() ? nullptr : &*it;
}

bool JsonObject::Has(absl::string_view key) const { return Find(key) != nullptr; }

std::string JsonObject::PathOf(absl::string_view key) const {
  return path_.empty() ? static_cast<std::string>(key) : absl::StrCat(path_, ".", key);
}

absl::Status JsonObject::Error(absl::string_view problem) const {
  return PathError(category_, path_.empty() ? "payload" : path_, problem, section_);
}

absl::Status JsonObject::MemberError(absl::string_view key, absl::string_view problem) const {
  return PathError(category_, PathOf(key), problem, section_);
}

absl::StatusOr<int64_t> JsonObject::Int(absl::string_view key, int64_t min, int64_t max) const {
  const json* member = Find(key);
  if (member == nullptr) return MemberError(key, "required member is missing");
  return ReadInt(*member, PathOf(key), min, max, category_, section_);
}

absl::StatusOr<std::optional<int64_t>> JsonObject::OptionalInt(absl::string_view key, int64_t min,
                                                               int64_t max) const {
  const json* member = Find(key);
  if (member == nullptr || member->is_null()) return std::optional<int64_t>();
  KVRAIL_ASSIGN_OR_RETURN(int64_t value,
                          ReadInt(*member, PathOf(key), min, max, category_, section_));
  return std::optional<int64_t>(value);
}

absl::StatusOr<bool> JsonObject::Bool(absl::string_view key) const {
  const json* member = Find(key);
  if (member == nullptr) return MemberError(key, "required member is missing");
  if (!member->is_boolean()) {
    return MemberError(key, absl::StrCat("must be true or false, got ", TypeName(*member)));
  }
  return member->get<bool>();
}

absl::StatusOr<std::string> JsonObject::String(absl::string_view key) const {
  const json* member = Find(key);
  if (member == nullptr) return MemberError(key, "required member is missing");
  if (!member->is_string()) {
    return MemberError(key, absl::StrCat("must be a JSON string, got ", TypeName(*member)));
  }
  return member->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> JsonObject::OptionalString(absl::string_view key) const {
  const json* member = Find(key);
  if (member == nullptr || member->is_null()) return std::optional<std::string>();
  if (!member->is_string()) {
    return MemberError(key, absl::StrCat("must be a JSON string or null, got ", TypeName(*member)));
  }
  return std::optional<std::string>(member->get<std::string>());
}

absl::StatusOr<const json*> JsonObject::Array(absl::string_view key) const {
  const json* member = Find(key);
  if (member == nullptr) return MemberError(key, "required member is missing");
  if (!member->is_array()) {
    return MemberError(key, absl::StrCat("must be a JSON array, got ", TypeName(*member)));
  }
  return member;
}

absl::StatusOr<JsonObject> JsonObject::Object(absl::string_view key) const {
  const json* member = Find(key);
  if (member == nullptr) return MemberError(key, "required member is missing");
  return Of(*member, PathOf(key), category_, section_);
}

absl::StatusOr<std::vector<int64_t>> JsonObject::IntArray(absl::string_view key, int64_t min,
                                                          int64_t max) const {
  KVRAIL_ASSIGN_OR_RETURN(const json* array, Array(key));
  std::vector<int64_t> out;
  out.reserve(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    const json& element = (*array)[i];
    // The common case without building the element's path (a manifest has up to ~10^6 of them).
    if (element.is_number_unsigned()) {
      const uint64_t u = element.get<uint64_t>();
      if (u <= static_cast<uint64_t>(max) && static_cast<int64_t>(u) >= min) {
        out.push_back(static_cast<int64_t>(u));
        continue;
      }
    } else if (element.is_number_integer()) {
      const int64_t v = element.get<int64_t>();
      if (v >= min && v <= max) {
        out.push_back(v);
        continue;
      }
    }
    KVRAIL_ASSIGN_OR_RETURN(
        int64_t value, ReadInt(element, IndexPath(PathOf(key), i), min, max, category_, section_));
    out.push_back(value);
  }
  return out;
}

absl::Status JsonObject::OnlyMembers(std::initializer_list<absl::string_view> known) const {
  for (const auto& [name, unused] : value_->items()) {
    bool found = false;
    for (absl::string_view k : known) found = found || k == name;
    if (!found) return MemberError(name, "unknown member; this record accepts no extra members");
  }
  return absl::OkStatus();
}

}  // namespace kvrail::layout
