// kvrail's key layout in etcd (README, "etcd registry"), and the values under it:
//
//   /kvrail/v1/sessions/<session id>          a decode sidecar's data-plane descriptor (leased)
//   /kvrail/v1/metrics/<role>-<rank>-<id>     a sidecar's metrics URL (leased)
//   /kvrail/v1/metrics/bootstrap-<host:port>  a bootstrap server's metrics URL (leased)
//   /kvrail/v1/nodes/<host:port>              a bootstrap server's node description (leased)
//   /kvrail/v1/bootstrap/<host:port>/<...>    a bootstrap server's registrations (not leased)
#ifndef KVRAIL_CONTROL_REGISTRY_KEYS_H_
#define KVRAIL_CONTROL_REGISTRY_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::registry {

inline constexpr absl::string_view kSessionsPrefix = "/kvrail/v1/sessions/";
inline constexpr absl::string_view kMetricsPrefix = "/kvrail/v1/metrics/";
inline constexpr absl::string_view kNodesPrefix = "/kvrail/v1/nodes/";
inline constexpr absl::string_view kBootstrapPrefix = "/kvrail/v1/bootstrap/";

std::string SessionKey(absl::string_view session_id);
// The session id of a key under kSessionsPrefix; "" for any other key.
std::string SessionIdOfKey(absl::string_view key);
std::string MetricsKey(absl::string_view role, int rank, absl::string_view id);
// A bootstrap server's metrics key: it has no rank; its address names it, as in NodeKey.
std::string BootstrapMetricsKey(absl::string_view host_port);
std::string NodeKey(absl::string_view host_port);
// The prefix of one bootstrap server's registrations ("/kvrail/v1/bootstrap/<host:port>/").
std::string BootstrapPrefix(absl::string_view host_port);

// The value under SessionKey: {"descriptor": "<base64 of the serialized HandshakeDescriptor>",
// "version": N, "role": "decode", "tp_rank": R, "metrics": "host:port" (absent when none)}.
struct SessionEntry {
  std::string descriptor;  // serialized v1::HandshakeDescriptor
  int64_t version = 0;
  std::string role = "decode";
  int tp_rank = 0;
  std::string metrics;  // "" when the sidecar has no metrics endpoint
  // The ttl of the entry's lease ("lease_ttl_s"), so that a watcher can say how long the entry
  // outlived its sidecar; 0 when absent.
  int64_t lease_ttl_s = 0;
};

std::string EncodeSessionEntry(const SessionEntry& entry);
// InvalidArgument naming `key` and the field at fault for a value that is not such an object.
absl::StatusOr<SessionEntry> DecodeSessionEntry(absl::string_view key, absl::string_view value);

// The value under MetricsKey: {"url": "http://host:port/metrics", "role": ..., "rank": N,
// "session": ...}.
std::string EncodeMetricsEntry(absl::string_view url, absl::string_view role, int rank,
                               absl::string_view session);

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_KEYS_H_
