#include "tools/top/registry_targets.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvrail::top {
namespace {

absl::StatusOr<Target> TargetOf(const std::string& key, const std::string& value) {
  auto bad = [&key](absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat("registry entry ", key, ": ", rule));
  };
  nlohmann::json entry = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!entry.is_object()) return bad("the value is not a JSON object");
  auto url = entry.find("url");
  if (url == entry.end() || !url->is_string()) return bad("it has no \"url\" string");
  const std::string text = url->get<std::string>();
  if (!absl::StartsWith(text, "http://"))
    return bad(absl::StrCat("url '", text, "' is not http://"));
  absl::StatusOr<Target> target = ParseTarget(text);
  if (!target.ok()) return bad(target.status().message());
  // The row shows what an operator would type for --endpoints.
  target->name = absl::StrCat(target->host.find(':') == std::string::npos
                                  ? target->host
                                  : absl::StrCat("[", target->host, "]"),
                              ":", target->port);
  return target;
}

}  // namespace

std::vector<ListedTarget> TargetsFromMetricsEntries(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  std::vector<ListedTarget> listed;
  for (const auto& [key, value] : entries) listed.push_back({key, TargetOf(key, value)});
  return listed;
}

}  // namespace kvrail::top
