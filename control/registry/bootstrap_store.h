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
//
// No write to etcd runs on the caller's thread: a PUT /route only queues its body, so an etcd
// that is slow or down never holds up the server's answers; the writer catches up when etcd is
// back (a registration accepted meanwhile is served at once and stored late, or, when the
// server stops before etcd returns, not at all: it is logged).
#ifndef KVRAIL_CONTROL_REGISTRY_BOOTSTRAP_STORE_H_
#define KVRAIL_CONTROL_REGISTRY_BOOTSTRAP_STORE_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/registry/lease_publisher.h"
#include "control/registry/write_queue.h"

namespace kvrail::registry {

class BootstrapStore {
 public:
  // `registry_url` is --registry (etcd://host:port); `ttl` the node entry's lease.
  // InvalidArgument for a bad URL; Unavailable naming the endpoint when etcd does not answer.
  static absl::StatusOr<std::unique_ptr<BootstrapStore>> Open(const std::string& registry_url,
                                                              absl::Duration ttl);
  ~BootstrapStore();  // Stop()

  // Names the server ("host:port", the keys' address) once it is bound, and starts writing
  // what Save was given before. Returns the registrations an earlier run with this address
  // stored, in key order. Reads etcd on the caller's thread, holding no lock Save needs.
  absl::StatusOr<std::vector<std::string>> Bind(const std::string& address);
  // Queues an accepted registration's body for etcd (from any thread; never waits for etcd).
  // The store's writer thread (write_queue.h) writes it, the latest body of each rank only,
  // retrying with backoff while etcd is away. Before Bind it is kept, the latest per rank.
  void Save(int dp_group, int rank_in_group, const std::string& body);
  // Publishes the node description (JSON) under the lease: handed to the lease's own thread
  // (lease_publisher.h), which keeps the latest only and never makes the caller wait. After
  // Bind.
  void PublishNode(const std::string& description);
  // Waits until the node description published last is in etcd (or `timeout` passed): false
  // on timeout.
  bool AwaitNodeWritten(absl::Duration timeout);
  // Revokes the node entry's lease (the registrations stay), then writes what it can of the
  // queued registrations within `flush_deadline` and joins the writer. Idempotent.
  void Stop(absl::Duration flush_deadline = absl::Seconds(2));

 private:
  BootstrapStore(std::string endpoint, std::unique_ptr<LeasePublisher> leased);

  const std::string endpoint_;
  std::unique_ptr<LeasePublisher> leased_;
  std::mutex mu_;        // held only to hand a body over, never across a call to etcd
  std::string address_;  // guarded by mu_; empty before Bind
  std::map<std::string, std::string> early_;  // guarded by mu_: suffix -> body, before Bind
  std::unique_ptr<WriteQueue> queue_;         // guarded by mu_ (the pointer); made by Bind
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
