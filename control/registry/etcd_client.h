// A client of etcd v3 (3.4) over its JSON gateway (the grpc-gateway every etcd serves on its
// client URL: POST /v3/kv/put, /v3/kv/range, ...; keys and values base64 in JSON), on
// cpp-httplib and nlohmann json. Debian 12 packages no etcd C++ client (no etcd-cpp-apiv3, and
// the gRPC one would need etcd's protos and grpc++), and the gateway needs nothing new.
//
// Every error names the endpoint, the call and etcd's own message, in one line. A client is
// safe to use from one thread at a time; make one per thread (they are cheap: one keep-alive
// HTTP connection each).
#ifndef KVRAIL_CONTROL_REGISTRY_ETCD_CLIENT_H_
#define KVRAIL_CONTROL_REGISTRY_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace httplib {
class Client;
}

namespace kvrail::registry {

// The largest value this client writes or accepts from etcd (a descriptor of many regions is
// a few KiB; etcd's own request limit is 1.5 MiB).
inline constexpr size_t kMaxValueBytes = size_t{1} << 20;
// The most keys one Range returns (a registry of thousands of sidecars fits).
inline constexpr int64_t kMaxRangeKeys = 65536;

// Parses "--registry etcd://host:port" into "host:port". InvalidArgument naming the flag's
// value and the rule otherwise (scheme etcd://, a host, a decimal port in [1, 65535], nothing
// after it).
absl::StatusOr<std::string> ParseRegistryUrl(absl::string_view url);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  // `endpoint` is "host:port" of etcd's client URL (http). `timeout` bounds each call's connect,
  // read and write.
  explicit EtcdClient(std::string endpoint, absl::Duration timeout = absl::Seconds(2));
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // GET /health: OK when etcd answers {"health":"true"}; Unavailable naming the endpoint else.
  absl::Status Health();
  // Writes `key` = `value`, attached to `lease` (0: none). Returns the revision it made.
  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value, int64_t lease = 0);
  // The value of `key`, or nullopt when it is absent.
  absl::StatusOr<std::optional<KeyValue>> Get(absl::string_view key);
  // Every key under `prefix` (at most kMaxRangeKeys), in key order, and the store's revision
  // at the read (`revision`, optional), from which a watch continues.
  absl::StatusOr<std::vector<KeyValue>> List(absl::string_view prefix, int64_t* revision = nullptr);
  // Deletes `key` (or, with `prefix`, every key under it). Returns how many were deleted.
  absl::StatusOr<int64_t> Delete(absl::string_view key, bool prefix = false);
  // Compacts the store's history up to `revision`: watches from before it are cancelled
  // (etcd does this itself with --auto-compaction-retention).
  absl::Status Compact(int64_t revision);
  // Grants a lease of `ttl` (whole seconds, at least 1). Returns its id.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Renews `lease`. Returns the ttl it has again; NotFound when it expired or was revoked.
  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease);
  // Revokes `lease`: its keys are deleted at once. A lease already gone is OK.
  absl::Status RevokeLease(int64_t lease);

 private:
  // POSTs `body` (JSON) to `path` and returns etcd's JSON answer as text; the error names the
  // endpoint, `call` and etcd's message.
  absl::StatusOr<std::string> Call(absl::string_view call, const std::string& path,
                                   const std::string& body);

  std::string endpoint_;
  std::unique_ptr<httplib::Client> http_;
};

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string PrefixEnd(absl::string_view prefix);

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_ETCD_CLIENT_H_
