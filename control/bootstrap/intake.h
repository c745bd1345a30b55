// The bootstrap server's front door: it accepts connections and reads each one's request whole
// on one thread, so that an idle or slow peer (slowloris) holds a file descriptor and a buffer,
// never a worker; hands each whole request to a worker thread to answer; and closes, with a
// one-line answer, every connection that breaks its bounds:
//   * a request not whole within request_deadline of its connection's accept: 408, however
//     steadily its bytes trickle in (a per-read timeout would let one byte a second go on);
//   * a head over limits.max_head_bytes: 431; a body over limits.max_body_bytes: 413, from its
//     Content-Length before any of it is read, or as its chunks arrive; framing that cannot be
//     read: 400 (request_frame.h). The peer's further bytes are read and dropped until it
//     closes or its deadline passes, so that it reads the answer rather than a reset;
//   * a connection beyond max_connections: to admit it, the longest-open connection the intake
//     still holds is closed: one already answered and being drained, else one still sending
//     its request (503). When every open connection is waiting for or being answered by a
//     worker, the new one is refused instead (503). A flood of idle connections therefore
//     cannot lock out a peer that sends its request at once (a decode's heartbeat, §1.6).
// Each such close is reported through on_refusal. Every connection closes after one answer.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_INTAKE_H_
#define KVRAIL_CONTROL_BOOTSTRAP_INTAKE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "control/bootstrap/request_frame.h"

namespace kvrail::bootstrap {

// One end of a TCP connection, the address as inet_ntop writes it; an IPv4 peer of a dual-stack
// socket is written as IPv4 ("10.2.0.1", not "::ffff:10.2.0.1").
struct PeerAddress {
  std::string ip;
  int port = 0;

  std::string ToString() const;  // "ip:port"; "[ip]:port" for IPv6
};

// Why the intake closed a connection that no worker answered.
enum class RefusalKind {
  kDeadline,         // 408: the request was not whole within the request deadline
  kHeadTooLarge,     // 431
  kBodyTooLarge,     // 413
  kMalformed,        // 400: its framing cannot be read
  kConnectionLimit,  // 503: max_connections were open
};

// "deadline", "head_too_large", "body_too_large", "malformed", "connection_limit".
absl::string_view RefusalKindName(RefusalKind kind);

struct RefusalEvent {
  RefusalKind kind = RefusalKind::kDeadline;
  int http_status = 0;
  PeerAddress peer;
  std::string reason;  // the one-line body the peer was sent
};

struct IntakeOptions {
  FrameLimits limits;
  // From accept to the request's last byte.
  std::chrono::milliseconds request_deadline{5000};
  // Open connections: being read, waiting for a worker, or being answered.
  size_t max_connections = 512;
  size_t worker_threads = 16;
  // Called on the intake thread, with no lock held, before the peer is sent its answer: must be
  // quick and must not call back into the intake.
  std::function<void(const RefusalEvent&)> on_refusal;
};

// One whole request, for a worker to answer.
struct WholeRequest {
  int fd = -1;        // non-blocking; the intake closes it once the answerer returns
  std::string bytes;  // exactly the request: head and body
  PeerAddress peer;
  PeerAddress local;
  bool continue_sent = false;  // the intake answered the request's "Expect: 100-continue"
  // The answer must be written by then; a peer that does not read it is not waited for longer.
  std::chrono::steady_clock::time_point answer_deadline;
};

class RequestIntake {
 public:
  // Writes the answer to `request` on request.fd. Called on a worker thread, several at once.
  using Answerer = std::function<void(const WholeRequest& request)>;

  RequestIntake(IntakeOptions options, Answerer answer);
  ~RequestIntake();  // Stop()s
  RequestIntake(const RequestIntake&) = delete;
  RequestIntake& operator=(const RequestIntake&) = delete;

  // Binds host:port (port 0: a free one, see port()) with SO_REUSEADDR only, never SO_REUSEPORT,
  // which would let a second server share the port and split the registrations, and serves
  // until Stop(). Unavailable when the address cannot be bound; FailedPrecondition when
  // started already. Connections are accepted from the moment Start returns.
  absl::Status Start(const std::string& host, int port);

  int port() const { return port_.load(); }

  // Stops accepting, closes every connection still being read, lets the workers answer the
  // whole requests they hold or have queued, and joins every thread. Idempotent.
  void Stop();

 private:
  struct Connection;

  void RunIntake();
  void RunWorker();
  void Service(Connection& c);
  void AcceptAll(std::vector<std::unique_ptr<Connection>>& connections,
                 std::chrono::steady_clock::time_point now);
  void Refuse(Connection& c, RefusalKind kind, int http_status, const std::string& reason);
  void Close(Connection& c);
  void Report(RefusalKind kind, int http_status, const PeerAddress& peer,
              const std::string& reason) const;

  const IntakeOptions options_;
  const Answerer answer_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: Stop() wakes the intake thread's poll
  std::atomic<int> port_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> open_{0};  // connections accepted and not closed yet
  std::chrono::steady_clock::time_point accept_paused_until_;  // intake thread only

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<WholeRequest> queue_;  // guarded by queue_mu_
  bool workers_stop_ = false;       // guarded by queue_mu_

  std::mutex lifecycle_mu_;  // serialises Start and Stop
  bool started_ = false;     // guarded by lifecycle_mu_
  std::thread intake_thread_;
  std::vector<std::thread> workers_;
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_INTAKE_H_
