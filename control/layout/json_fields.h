// Typed, path-aware reads of JSON members for the contract and manifest parsers.
//
// Every error names the member by its full path ("plan.fields[2].shape[1]"), the rule broken
// and the spec section, so a peer's operator can find the bad byte without a debugger.
#ifndef KVRAIL_CONTROL_LAYOUT_JSON_FIELDS_H_
#define KVRAIL_CONTROL_LAYOUT_JSON_FIELDS_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/base/error.h"

namespace kvrail::layout {

inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// A JSON object being read, with the path that leads to it.
class JsonObject {
 public:
  // Returns the object at `value`, or an error if it is not a JSON object.
  static absl::StatusOr<JsonObject> Of(const nlohmann::json& value, std::string path,
                                       ErrorCategory category, absl::string_view section);

  const std::string& path() const { return path_; }
  bool Has(absl::string_view key) const;
  std::string PathOf(absl::string_view key) const;

  // An error of this reader's category about this object, or about member `key`.
  absl::Status Error(absl::string_view problem) const;
  absl::Status MemberError(absl::string_view key, absl::string_view problem) const;

  // A required JSON integer (not a bool, not a float) in [min, max].
  absl::StatusOr<int64_t> Int(absl::string_view key, int64_t min = 0,
                              int64_t max = kInt64Max) const;
  // An optional integer: absent or null gives nullopt.
  absl::StatusOr<std::optional<int64_t>> OptionalInt(absl::string_view key, int64_t min = 0,
                                                     int64_t max = kInt64Max) const;
  // A required JSON boolean (true or false; not null, not 0 or 1).
  absl::StatusOr<bool> Bool(absl::string_view key) const;
  absl::StatusOr<std::string> String(absl::string_view key) const;
  // An optional string: absent or null gives nullopt.
  absl::StatusOr<std::optional<std::string>> OptionalString(absl::string_view key) const;
  // A required array member.
  absl::StatusOr<const nlohmann::json*> Array(absl::string_view key) const;
  // A required object member.
  absl::StatusOr<JsonObject> Object(absl::string_view key) const;
  // A required array of integers, each in [min, max].
  absl::StatusOr<std::vector<int64_t>> IntArray(absl::string_view key, int64_t min = 0,
                                                int64_t max = kInt64Max) const;

  // Rejects any member not named in `known` (CACHEPD §4.3 item 4 for the record types).
  absl::Status OnlyMembers(std::initializer_list<absl::string_view> known) const;

 private:
  JsonObject(const nlohmann::json* value, std::string path, ErrorCategory category,
             absl::string_view section)
      : value_(value), path_(std::move(path)), category_(category), section_(section) {}

  const nlohmann::json* Find(absl::string_view key) const;

  const nlohmann::json* value_;
  std::string path_;
  ErrorCategory category_;
  absl::string_view section_;
};

// Reads `value` (found at `path`) as a JSON integer in [min, max].
absl::StatusOr<int64_t> ReadInt(const nlohmann::json& value, absl::string_view path, int64_t min,
                                int64_t max, ErrorCategory category, absl::string_view section);

// "plan.fields" + 3 -> "plan.fields[3]".
std::string IndexPath(absl::string_view path, size_t index);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_JSON_FIELDS_H_
