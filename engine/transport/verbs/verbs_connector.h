// The verbs backend's queue-pair exchange (proto/kvrail/v1/verbs.proto): an RC queue pair
// connects exactly two queue pairs, so a requester's Connect asks the peer's connect endpoint
// for responder QPs and learns their numbers and PSNs; Disconnect tells the peer to destroy
// them.
//
// ZeroMQ, one ROUTER per transport on a thread of its own, frames [ "kvrail.verbs.v1", <body> ]
// with a serialised VerbsConnectMessage (connect or release) and, for a connect, a reply
// [ "kvrail.verbs.v1", <VerbsConnectReply> ]. Requests are capped at 64 KiB; a malformed one is
// answered with an error naming the rule it broke and changes nothing.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_CONNECTOR_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_CONNECTOR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/kvrail/v1/verbs.pb.h"

namespace kvrail::transport {

inline constexpr char kVerbsConnectMagic[] = "kvrail.verbs.v1";
inline constexpr int64_t kMaxVerbsConnectBytes = 64 << 10;

class VerbsConnectServer {
 public:
  // Answers a connect request (on the server's thread).
  using OnConnect = std::function<v1::VerbsConnectReply(const v1::VerbsConnectRequest&)>;
  using OnRelease = std::function<void(const v1::VerbsRelease&)>;

  // Binds tcp://<host>:<ephemeral port>. Unavailable naming the endpoint when the bind fails.
  static absl::StatusOr<std::unique_ptr<VerbsConnectServer>> Start(const std::string& host,
                                                                   OnConnect on_connect,
                                                                   OnRelease on_release);
  ~VerbsConnectServer();  // Stops the thread: no handler runs once it returns.
  VerbsConnectServer(const VerbsConnectServer&) = delete;
  VerbsConnectServer& operator=(const VerbsConnectServer&) = delete;

  // "tcp://<host>:<port>".
  const std::string& endpoint() const { return endpoint_; }

 private:
  VerbsConnectServer() = default;
  void Run();

  struct Sockets;
  std::unique_ptr<Sockets> sockets_;
  OnConnect on_connect_;
  OnRelease on_release_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sends `request` to `endpoint` and waits up to `timeout` for the reply. DeadlineExceeded naming
// the endpoint when nobody answers in time; DataLoss for a reply that is not a VerbsConnectReply;
// FailedPrecondition with the peer's line when it refused.
absl::StatusOr<v1::VerbsConnectReply> RequestVerbsConnect(const std::string& endpoint,
                                                          const v1::VerbsConnectRequest& request,
                                                          absl::Duration timeout);

// Tells `endpoint` to release a connection; waits for nothing (at most `linger` to hand the
// message to the socket).
void SendVerbsRelease(const std::string& endpoint, const v1::VerbsRelease& release,
                      absl::Duration linger = absl::Milliseconds(100));

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_CONNECTOR_H_
