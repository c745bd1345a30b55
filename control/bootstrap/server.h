// The CachePD bootstrap server (CACHEPD §2): the HTTP rendezvous of one prefill node. Prefill
// ranks register their control endpoints with PUT /route; decode ranks read the node's
// description and each rank's endpoint with GET /route; heartbeats read GET /health (§1.6).
//
// Answers, byte for byte as the reference's (tests/data/cachepd/bootstrap.json):
//   PUT /route                       200 text/plain "OK"; refusals below
//   GET /route?engine_rank=-1&target_dp_group=-1
//                                    200 application/json, SyncAnswer(): the 2026-09 answer
//                                    (§12.4), or the snapshot's (§2.2) when pinned to it
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
//
// kvrail's own bounds and rules (docs/SECURITY.md); every body is one text/plain line naming
// the input and the rule:
//   PUT /route, a token configured and the request without "Authorization: Bearer <token>"
//                                    401 (with "WWW-Authenticate: Bearer"); the body is not parsed
//   PUT /route, a registered rank with another endpoint, neither from the rank's registered IP
//   nor with the token               409, naming the rank and its registered endpoint
//   PUT /route, world_size, dp_size or layout other than configured
//                                    409, and the node is unchanged
//   a body over max_body_bytes       413, from its Content-Length before the body is read
//   a head over 16 KiB               431
//   framing that cannot be read (both Content-Length and Transfer-Encoding, a bad length)
//                                    400
//   a request not whole within request_deadline of its connection opening
//                                    408, then the connection is closed
//   a connection beyond max_connections
//                                    503 to the longest-open one still sending its request
//                                    (closed to admit the new one), or to the new one when every
//                                    open connection is being answered
// The last five come from the intake (intake.h), which reads requests without tying up a worker,
// so idle and slow connections cannot starve /health (§1.6). Every connection is closed after
// one answer ("Connection: close").
#ifndef KVRAIL_CONTROL_BOOTSTRAP_SERVER_H_
#define KVRAIL_CONTROL_BOOTSTRAP_SERVER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "control/bootstrap/intake.h"
#include "control/bootstrap/registry.h"
#include "control/layout/revision.h"

namespace kvrail::bootstrap {

class HttpAnswerer;

// One PUT /route, as the server answered it.
struct RegistrationEvent {
  absl::Status status;  // OK when accepted; otherwise the refusal
  int http_status = 200;
  PeerAddress peer;  // the connection the request came on
  // Set when accepted: the registration and what it changed.
  std::optional<PrefillRegistration> registration;
  RegistrationOutcome outcome;
};

// One request answered by a worker (not those the intake refused: on_refusal).
struct RequestEvent {
  std::string method;
  std::string path;
  int http_status = 200;
  std::chrono::nanoseconds duration{0};  // the worker's time: from the whole request to the answer
};

struct BootstrapServerOptions {
  // Called once per PUT /route, after the answer is decided, on a server thread, with no lock
  // held. Must be thread-safe. kvrail's library code never logs; `kvrail bootstrap` logs here.
  std::function<void(const RegistrationEvent&)> on_registration;
  // Called once per request refused, or connection closed, by the intake (intake.h: 408, 413,
  // 431, 400, 503), on the intake thread with no lock held: must be quick and thread-safe.
  std::function<void(const RefusalEvent&)> on_refusal;
  // Called once per request a worker answered, on that worker, with no lock held: must be quick
  // and thread-safe (`kvrail bootstrap --metrics-port` counts here).
  std::function<void(const RequestEvent&)> on_request;
  // Bodies above this size are answered 413 before they are read. A contract is at most 256 KiB.
  size_t max_body_bytes = size_t{1} << 20;
  // Threads answering whole requests; reading them takes none (intake.h).
  size_t worker_threads = 16;
  // Open connections at most; past it the longest-open one still sending is closed (intake.h).
  size_t max_connections = 512;
  // From a connection's accept to its request's last byte, head and body; and again for
  // writing the answer.
  std::chrono::milliseconds request_deadline{5000};
  // When not empty, PUT /route must carry "Authorization: Bearer <token>" (bearer_token.h; the
  // token must pass ValidateBearerToken). Empty: nothing changes on the wire.
  std::string bearer_token;
  // The node's sizes and layout, when fixed before any rank registers (registry.h).
  ConfiguredNode configured;
  // The CachePD revision the server speaks (`kvrail bootstrap --cachepd-revision`). nullopt
  // (auto, the default): registrations of both forms (CACHEPD §2.1, §12.3) are accepted, and
  // the sync answer is 2026-09's (§12.4), which a snapshot decode reads too (§2.3). Pinned, for
  // interop tests and operators who must emulate one revision: registrations of the other are
  // refused (ParseRegistration) and the sync answer has that revision's members.
  std::optional<layout::Revision> cachepd_revision;
};

class BootstrapServer {
 public:
  explicit BootstrapServer(BootstrapServerOptions options = {});
  ~BootstrapServer();  // Stop()s
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;

  // Binds host:port and serves on background threads until Stop(). Port 0 picks a free port;
  // port() then reports it. Connections are accepted from the moment Start returns. Fails
  // (Unavailable) when the address cannot be bound, FailedPrecondition when started already,
  // InvalidArgument when the token is not one (bearer_token.h). A server is started at most once.
  absl::Status Start(const std::string& host, int port);

  // The bound port; 0 before Start succeeds.
  int port() const { return intake_.port(); }

  // Closes the listening socket and the connections still sending their requests, lets the
  // requests received whole be answered, and joins every server thread. Idempotent; safe before
  // Start.
  void Stop();

  const PrefillRegistry& registry() const { return registry_; }

  // The sync answer's JSON: registry().Describe() in the form of the server's revision.
  nlohmann::ordered_json SyncAnswer() const;

 private:
  const BootstrapServerOptions options_;
  PrefillRegistry registry_;
  std::unique_ptr<HttpAnswerer> http_;  // answers each whole request as httplib would
  RequestIntake intake_;
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_SERVER_H_
