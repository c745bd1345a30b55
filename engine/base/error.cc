#include "engine/base/error.h"

#include <array>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace kvrail {
namespace {

constexpr absl::string_view kCategoryPayload = "type.kvrail.dev/error-category";

constexpr std::array<std::pair<ErrorCategory, absl::string_view>, 5> kNames = {{
    {ErrorCategory::kInvalidFrame, "invalid-frame"},
    {ErrorCategory::kInvalidContract, "invalid-contract"},
    {ErrorCategory::kIncompatiblePeer, "incompatible-peer"},
    {ErrorCategory::kInvalidManifest, "invalid-manifest"},
    {ErrorCategory::kUnsupportedLayout, "unsupported-layout"},
}};

// The message with every control character (below 0x20, and 0x7F) written as \xNN: errors
// quote peers' text (ids, member names), and a quoted newline must not start a line of its own
// in a log or an answer.
std::string OneLine(absl::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

absl::string_view CategoryName(ErrorCategory category) {
  for (const auto& [value, name] : kNames) {
    if (value == category) return name;
  }
  return "error";
}

std::optional<ErrorCategory> CategoryFromName(absl::string_view name) {
  for (const auto& [value, known] : kNames) {
    if (known == name) return value;
  }
  return std::nullopt;
}

absl::Status MakeError(ErrorCategory category, absl::string_view message) {
  absl::Status status(absl::StatusCode::kInvalidArgument, OneLine(message));
  status.SetPayload(kCategoryPayload, absl::Cord(CategoryName(category)));
  return status;
}

std::optional<ErrorCategory> CategoryOf(const absl::Status& status) {
  auto payload = status.GetPayload(kCategoryPayload);
  if (!payload.has_value()) return std::nullopt;
  return CategoryFromName(static_cast<std::string>(*payload));
}

absl::Status AddContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), OneLine(absl::StrCat(context, ": ", status.message())));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

std::string DescribeError(const absl::Status& status) {
  std::optional<ErrorCategory> category = CategoryOf(status);
  return absl::StrCat(category ? CategoryName(*category) : "error", ": ", status.message());
}

}  // namespace kvrail
