#include "control/registry/keys.h"

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvrail::registry {

using nlohmann::json;

std::string SessionKey(absl::string_view session_id) {
  return absl::StrCat(kSessionsPrefix, session_id);
}

std::string SessionIdOfKey(absl::string_view key) {
  if (!absl::ConsumePrefix(&key, kSessionsPrefix)) return "";
  return std::string(key);
}

std::string MetricsKey(absl::string_view role, int rank, absl::string_view id) {
  return absl::StrCat(kMetricsPrefix, role, "-", rank, "-", id);
}

std::string BootstrapMetricsKey(absl::string_view host_port) {
  return absl::StrCat(kMetricsPrefix, "bootstrap-", host_port);
}

std::string NodeKey(absl::string_view host_port) { return absl::StrCat(kNodesPrefix, host_port); }

std::string BootstrapPrefix(absl::string_view host_port) {
  return absl::StrCat(kBootstrapPrefix, host_port, "/");
}

std::string EncodeSessionEntry(const SessionEntry& entry) {
  json value = {{"descriptor", absl::Base64Escape(entry.descriptor)},
                {"version", entry.version},
                {"role", entry.role},
                {"tp_rank", entry.tp_rank}};
  if (!entry.metrics.empty()) value["metrics"] = entry.metrics;
  if (entry.lease_ttl_s > 0) value["lease_ttl_s"] = entry.lease_ttl_s;
  return value.dump();
}

absl::StatusOr<SessionEntry> DecodeSessionEntry(absl::string_view key, absl::string_view value) {
  const auto bad = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat("registry entry ", key, ": ", rule));
  };
  json parsed = json::parse(value.begin(), value.end(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return bad("the value is not a JSON object");
  SessionEntry entry;
  auto descriptor = parsed.find("descriptor");
  if (descriptor == parsed.end() || !descriptor->is_string() ||
      !absl::Base64Unescape(descriptor->get<std::string>(), &entry.descriptor) ||
      entry.descriptor.empty()) {
    return bad("\"descriptor\" must be a non-empty base64 string");
  }
  auto version = parsed.find("version");
  if (version == parsed.end() || !version->is_number_integer()) {
    return bad("\"version\" must be an integer");
  }
  entry.version = version->get<int64_t>();
  auto role = parsed.find("role");
  if (role == parsed.end() || !role->is_string()) return bad("\"role\" must be a string");
  entry.role = role->get<std::string>();
  auto rank = parsed.find("tp_rank");
  if (rank == parsed.end() || !rank->is_number_integer() || rank->get<int64_t>() < 0 ||
      rank->get<int64_t>() > 1 << 20) {
    return bad("\"tp_rank\" must be an integer in [0, 2^20]");
  }
  entry.tp_rank = rank->get<int>();
  auto metrics = parsed.find("metrics");
  if (metrics != parsed.end()) {
    if (!metrics->is_string()) return bad("\"metrics\" must be a string when present");
    entry.metrics = metrics->get<std::string>();
  }
  auto ttl = parsed.find("lease_ttl_s");
  if (ttl != parsed.end() && ttl->is_number_integer()) entry.lease_ttl_s = ttl->get<int64_t>();
  return entry;
}

std::string EncodeMetricsEntry(absl::string_view url, absl::string_view role, int rank,
                               absl::string_view session) {
  return json{{"url", url}, {"role", role}, {"rank", rank}, {"session", session}}.dump();
}

}  // namespace kvrail::registry
