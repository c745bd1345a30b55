#include "control/registry/metrics_entry.h"

#include "absl/strings/str_cat.h"
#include "control/registry/etcd_client.h"
#include "control/registry/keys.h"

namespace kvrail::registry {

namespace {

absl::StatusOr<std::unique_ptr<LeasePublisher>> PublishLeased(const std::string& registry_url,
                                                              absl::Duration ttl,
                                                              const std::string& key,
                                                              const std::string& value) {
  absl::StatusOr<std::string> endpoint = ParseRegistryUrl(registry_url);
  if (!endpoint.ok()) return endpoint.status();
  absl::StatusOr<std::unique_ptr<LeasePublisher>> leased = LeasePublisher::Start(*endpoint, ttl);
  if (!leased.ok()) return leased.status();
  (*leased)->Publish(key, value);
  return leased;
}

std::string MetricsUrl(const std::string& metrics_address) {
  return absl::StrCat("http://", metrics_address, "/metrics");
}

}  // namespace

absl::StatusOr<std::unique_ptr<LeasePublisher>> PublishMetricsEntry(
    const std::string& registry_url, absl::Duration ttl, const std::string& role, int rank,
    const std::string& id, const std::string& metrics_address) {
  return PublishLeased(registry_url, ttl, MetricsKey(role, rank, id),
                       EncodeMetricsEntry(MetricsUrl(metrics_address), role, rank, id));
}

absl::StatusOr<std::unique_ptr<LeasePublisher>> PublishBootstrapMetricsEntry(
    const std::string& registry_url, absl::Duration ttl, const std::string& host_port,
    const std::string& metrics_address) {
  return PublishLeased(registry_url, ttl, BootstrapMetricsKey(host_port),
                       EncodeMetricsEntry(MetricsUrl(metrics_address), "bootstrap", 0, host_port));
}

}  // namespace kvrail::registry
