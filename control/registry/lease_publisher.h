// Keys kept alive in etcd under one lease: a sidecar's descriptor and metrics address, a
// bootstrap server's node description. They vanish when the lease expires (the process died or
// stopped renewing it) or is revoked (a clean Stop).
//
// A thread of its own renews the lease every ttl/3 and writes what Publish handed it, so no
// caller ever waits for etcd. When etcd loses the lease (it was down longer than the ttl, or
// restarted empty) the thread grants a new one and writes every key again. A registry that goes
// away is logged (OutageLog) and retried each renewal; the keys come back with it.
#ifndef KVRAIL_CONTROL_REGISTRY_LEASE_PUBLISHER_H_
#define KVRAIL_CONTROL_REGISTRY_LEASE_PUBLISHER_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/registry/etcd_client.h"
#include "control/registry/outage_log.h"

namespace kvrail::registry {

class LeasePublisher {
 public:
  // Checks etcd's health at `endpoint` and grants a lease of `ttl` (at least 1 s): Unavailable
  // naming the endpoint when etcd does not answer, so that a registry down at start is a start
  // error.
  static absl::StatusOr<std::unique_ptr<LeasePublisher>> Start(const std::string& endpoint,
                                                               absl::Duration ttl);
  ~LeasePublisher();  // Stop()
  LeasePublisher(const LeasePublisher&) = delete;
  LeasePublisher& operator=(const LeasePublisher&) = delete;

  // Sets `key` = `value` under the lease: written by the thread right away, and again whenever
  // the lease is granted anew. A later Publish of the same key replaces the value.
  void Publish(const std::string& key, const std::string& value);
  // Waits until everything published so far has been written (or `timeout` passed): false on
  // timeout. For tests and for a start that wants its keys visible before it announces itself.
  bool AwaitWritten(absl::Duration timeout);
  // Revokes the lease (every key goes at once) and joins the thread. Idempotent.
  void Stop();

  absl::Duration ttl() const { return ttl_; }
  // The lease now (0 while none is granted).
  int64_t lease() const;

 private:
  LeasePublisher(std::string endpoint, absl::Duration ttl, int64_t lease);
  void Run();

  const std::string endpoint_;
  const absl::Duration ttl_;
  EtcdClient client_;  // the thread's only
  OutageLog outage_;

  // std::mutex: TSan sees it (Debian's absl is not instrumented).
  mutable std::mutex mu_;
  std::condition_variable changed_;            // dirty_ grew, or stop_
  std::condition_variable written_;            // dirty_ shrank
  int64_t lease_ = 0;                          // guarded by mu_
  std::map<std::string, std::string> values_;  // guarded by mu_
  std::set<std::string> dirty_;                // guarded by mu_
  bool stop_ = false;                          // guarded by mu_
  bool stopped_ = false;                       // Stop's, on the caller's thread
  std::thread thread_;
};

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_LEASE_PUBLISHER_H_
