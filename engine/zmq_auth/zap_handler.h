// The ZAP handler of one ZeroMQ context (ZMQ RFC 27): a thread with a REP socket bound to
// inproc://zeromq.zap.01, which libzmq asks about every connection a CURVE server socket of that
// context is handshaking. It accepts mechanism CURVE only, for a client public key listed in
// AllowedKeys (and admitted by the policy, when one is given), and names the connection's
// User-Id "<role>:<rank>:<name>" (key_file.h): every message received on it carries that
// User-Id (zmq_msg_gets). Anything else is answered 400 and reported: that connection never
// delivers a message.
//
// Each context needs its own handler (the endpoint is per context): start it before any CURVE
// server socket of the context binds, and stop it (destroy it) before the context terminates,
// since zmq_ctx_term waits for its socket.
#ifndef KVRAIL_ENGINE_ZMQ_AUTH_ZAP_HANDLER_H_
#define KVRAIL_ENGINE_ZMQ_AUTH_ZAP_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/zmq_auth/allowed_keys.h"

namespace kvrail::zmq_auth {

struct ZapOptions {
  std::shared_ptr<const AllowedKeys> allowed;
  // Which of the allowed identities this context's servers take (for example only decode keys
  // on a prefill's CachePD socket); a refusal's message is the reason reported. Empty: all.
  std::function<absl::Status(const KeyIdentity&)> admit;
  // Called on the handler's thread for each refused connection, with the peer's address and
  // the reason (one line). Must not block; the caller rate-limits its log.
  std::function<void(const std::string& address, const std::string& reason)> on_refusal;
};

class ZapHandler {
 public:
  // Binds inproc://zeromq.zap.01 in `context` (a zmq_ctx_new handle) and starts answering.
  // InvalidArgument without allowed keys; Unavailable when the endpoint is taken (the context
  // has a handler already).
  static absl::StatusOr<std::unique_ptr<ZapHandler>> Start(void* context, ZapOptions options);
  ~ZapHandler();  // Stop()
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Joins the thread and closes the socket. Idempotent.
  void Stop();

  uint64_t accepted() const { return accepted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  ZapHandler() = default;
  void Run();
  // Answers one request (its frames).
  void Answer(const std::vector<std::string>& request);

  ZapOptions options_;
  void* socket_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace kvrail::zmq_auth

#endif  // KVRAIL_ENGINE_ZMQ_AUTH_ZAP_HANDLER_H_
