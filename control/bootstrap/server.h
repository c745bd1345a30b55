// The CachePD bootstrap server (CACHEPD §2): the HTTP rendezvous of one prefill node. Prefill
// ranks register their control endpoints with PUT /route; decode ranks read the node's
// description and each rank's endpoint with GET /route; heartbeats read GET /health (§1.6).
//
// Answers, byte for byte as the reference's (tests/data/cachepd/bootstrap.json):
//   PUT /route                       200 text/plain "OK"; refusals below
//   GET /route?engine_rank=-1&target_dp_group=-1
//                                    200 application/json, NodeDescription::ToJson()
//   GET /route?engine_rank=r&target_dp_group=g
//                                    200 application/json {"rank_ip": ..., "rank_port": ...}
//   GET /route, a parameter missing or empty
//                                    400 text/plain "Missing inputs for bootstrap server."
//   /route, any other method         405 application/json "Method not allowed"
//   GET or HEAD /health              200 text/plain "OK"
//   /health, any other method        405 text/plain "405: Method Not Allowed"
//   any other path                   404 text/plain "404: Not Found"
// JSON is written as Python's json.dumps writes it. A refused request gets the status of its
// refusal (refusal.h: 500 where the reference raises, 400 or 409 for kvrail's own rules) and a
// text/plain body of one line naming the member and the rule.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_SERVER_H_
#define KVRAIL_CONTROL_BOOTSTRAP_SERVER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/bootstrap/registry.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace kvrail::bootstrap {

// One PUT /route, as the server answered it.
struct RegistrationEvent {
  absl::Status status;  // OK when accepted; otherwise the refusal
  int http_status = 200;
  std::string peer;  // "ip:port" of the connection the request came on
  // Set when accepted: the registration and what it changed.
  std::optional<PrefillRegistration> registration;
  RegistrationOutcome outcome;
};

struct BootstrapServerOptions {
  // Called once per PUT /route, after the answer is decided, on a server thread, with no lock
  // held. Must be thread-safe. kvrail's library code never logs; `kvrail bootstrap` logs here.
  std::function<void(const RegistrationEvent&)> on_registration;
  // Bodies above this size are answered 413 by the HTTP layer. A contract is at most 256 KiB.
  size_t max_body_bytes = size_t{1} << 20;
  // Threads answering requests. Every connection is closed after one answer (with
  // "Connection: close"), so a decode's keep-alive heartbeat (§1.6) never pins a thread between
  // beats; it reconnects, as HTTP clients do.
  size_t worker_threads = 16;
  // How long an accepted connection may wait for its request. Stop() waits at most about this
  // long for a connection that never sends one.
  std::chrono::seconds idle_timeout{2};
};

class BootstrapServer {
 public:
  explicit BootstrapServer(BootstrapServerOptions options = {});
  ~BootstrapServer();  // Stop()s
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;

  // Binds host:port and serves on a background thread until Stop(). Port 0 picks a free port;
  // port() then reports it. Connections are accepted (queued) from the moment Start returns.
  // Fails (Unavailable) when the address cannot be bound, FailedPrecondition when started
  // already. A server is started at most once.
  absl::Status Start(const std::string& host, int port);

  // The bound port; 0 before Start succeeds.
  int port() const { return port_.load(); }

  // Closes the listening socket, lets requests in progress finish, and joins every server
  // thread. Idempotent; safe before Start.
  void Stop();

  const PrefillRegistry& registry() const { return registry_; }

 private:
  BootstrapServerOptions options_;
  PrefillRegistry registry_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<int> port_{0};
  int listen_fd_ = -1;  // set while Start binds
  std::atomic<bool> listen_returned_{false};
  std::mutex lifecycle_mu_;  // serialises Start and Stop
  bool started_ = false;     // guarded by lifecycle_mu_
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_SERVER_H_
