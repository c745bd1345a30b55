// A process's metrics endpoint in the registry, for `kvrail top` and operators' tools:
// /kvrail/v1/metrics/<role>-<rank>-<id> = {"url": "http://host:port/metrics", "role": ...,
// "rank": N, "session": ...}, under a lease of its own that lives as long as the returned
// publisher. A bootstrap server's is /kvrail/v1/metrics/bootstrap-<host:port>.
#ifndef KVRAIL_CONTROL_REGISTRY_METRICS_ENTRY_H_
#define KVRAIL_CONTROL_REGISTRY_METRICS_ENTRY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/registry/lease_publisher.h"

namespace kvrail::registry {

// `registry_url` is the --registry value (etcd://host:port); `metrics_address` the metrics
// server's "host:port". InvalidArgument for a bad URL; Unavailable naming the endpoint when etcd
// does not answer.
absl::StatusOr<std::unique_ptr<LeasePublisher>> PublishMetricsEntry(
    const std::string& registry_url, absl::Duration ttl, const std::string& role, int rank,
    const std::string& id, const std::string& metrics_address);

// A bootstrap server's, at BootstrapMetricsKey(host_port): role "bootstrap", rank 0, session
// its "host:port". Errors as above.
absl::StatusOr<std::unique_ptr<LeasePublisher>> PublishBootstrapMetricsEntry(
    const std::string& registry_url, absl::Duration ttl, const std::string& host_port,
    const std::string& metrics_address);

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_METRICS_ENTRY_H_
