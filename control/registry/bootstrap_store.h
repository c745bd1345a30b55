// `kvrail bootstrap --registry etcd://host:port`: a bootstrap server's state in etcd, so that a
// restarted server loses nothing and decode ranks can find nodes.
//
//   /kvrail/v1/nodes/<host:port>                          its node description (leased)
//   /kvrail/v1/bootstrap/<host:port>/ranks/<dp>/<rank>    each accepted registration, as the
//                                                         PUT /route body (not leased)
//
// At start the server reads the registrations stored under its own address back and replays
// them as PUT /route to itself (ReplayRegistrations), so it answers GET /route exactly as
// before and its own rules (sizes, layout, a rank's endpoint) still hold.
#ifndef KVRAIL_CONTROL_REGISTRY_BOOTSTRAP_STORE_H_
#define KVRAIL_CONTROL_REGISTRY_BOOTSTRAP_STORE_H_

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/registry/etcd_client.h"
#include "control/registry/lease_publisher.h"

namespace kvrail::registry {

class BootstrapStore {
 public:
  // `registry_url` is --registry (etcd://host:port); `ttl` the node entry's lease.
  // InvalidArgument for a bad URL; Unavailable naming the endpoint when etcd does not answer.
  static absl::StatusOr<std::unique_ptr<BootstrapStore>> Open(const std::string& registry_url,
                                                              absl::Duration ttl);

  // Names the server ("host:port", the keys' address) once it is bound, and writes what Save
  // was given before. Returns the registrations an earlier run with this address stored, in
  // key order.
  absl::StatusOr<std::vector<std::string>> Bind(const std::string& address);
  // Stores an accepted registration's body (from any thread; a PUT of at most a second or
  // two, logged when it fails). Before Bind it is kept and written by Bind.
  void Save(int dp_group, int rank_in_group, const std::string& body);
  // Publishes the node description (JSON) under the lease. After Bind.
  void PublishNode(const std::string& description);
  // Revokes the node entry's lease (the registrations stay). Idempotent.
  void Stop() { leased_->Stop(); }

 private:
  BootstrapStore(std::string endpoint, std::unique_ptr<LeasePublisher> leased);
  absl::Status Write(const std::string& suffix, const std::string& body);  // needs mu_

  std::unique_ptr<LeasePublisher> leased_;
  std::mutex mu_;
  EtcdClient client_;                                         // guarded by mu_
  std::string address_;                                       // guarded by mu_; empty before Bind
  std::vector<std::pair<std::string, std::string>> pending_;  // (suffix, body), before Bind
};

// The address a bootstrap server's keys use: `host:port`, with this machine's host name for a
// wildcard or empty host.
std::string BootstrapAddress(const std::string& host, int port);

// PUTs each body to http://host:port/route (with "Authorization: Bearer <token>" when `token`
// is not empty). Returns one line per body the server refused (naming it and the answer).
std::vector<std::string> ReplayRegistrations(const std::string& host, int port,
                                             const std::string& token,
                                             const std::vector<std::string>& bodies);

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_BOOTSTRAP_STORE_H_
