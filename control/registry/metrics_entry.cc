#include "control/registry/metrics_entry.h"

#include "absl/strings/str_cat.h"
#include "control/registry/etcd_client.h"
#include "control/registry/keys.h"

namespace kvrail::registry {

absl::StatusOr<std::unique_ptr<LeasePublisher>> PublishMetricsEntry(
    const std::string& registry_url, absl::Duration ttl, const std::string& role, int rank,
    const std::string& id, const std::string& metrics_address) {
  absl::StatusOr<std::string> endpoint = ParseRegistryUrl(registry_url);
  if (!endpoint.ok()) return endpoint.status();
  absl::StatusOr<std::unique_ptr<LeasePublisher>> leased = LeasePublisher::Start(*endpoint, ttl);
  if (!leased.ok()) return leased.status();
  (*leased)->Publish(
      MetricsKey(role, rank, id),
      EncodeMetricsEntry(absl::StrCat("http://", metrics_address, "/metrics"), role, rank, id));
  return leased;
}

}  // namespace kvrail::registry
