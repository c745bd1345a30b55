// The CachePD control-plane channel over ZeroMQ (CACHEPD §1.1): every rank binds one PULL
// socket (its inbox) and pushes to each peer through one PUSH socket cached per peer endpoint
// (its outbox). There are no replies on a socket: an answer is a push to the peer's own inbox.
//
// The ZeroMQ types stay in the .cc; callers see frames as strings and errors as statuses.
#ifndef KVRAIL_CONTROL_SESSION_ZMQ_CHANNEL_H_
#define KVRAIL_CONTROL_SESSION_ZMQ_CHANNEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "control/session/inbox_watch.h"
#include "engine/zmq_auth/key_file.h"
#include "engine/zmq_auth/zap_handler.h"

namespace kvrail::session {

// One ZeroMQ context (one I/O thread), shared by the inboxes and outboxes made from it. It is
// terminated when the last of them and the caller's handle are gone. Thread-safe.
class ZmqContext {
 public:
  static std::shared_ptr<ZmqContext> Create();
  // With CURVE on (docs/SECURITY.md): the context's ZAP handler (zmq_auth/zap_handler.h),
  // started before any inbox binds and stopped before the context terminates.
  static absl::StatusOr<std::shared_ptr<ZmqContext>> CreateWithZap(zmq_auth::ZapOptions zap);
  ~ZmqContext();
  ZmqContext(const ZmqContext&) = delete;
  ZmqContext& operator=(const ZmqContext&) = delete;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  ZmqContext();
  std::unique_ptr<Impl> impl_;
};

struct InboxOptions {
  // Messages queued in the socket before the peers' sends start to fail (ZMQ_RCVHWM).
  int receive_hwm = 10000;
  // A peer that sends a larger frame is disconnected by ZeroMQ (ZMQ_MAXMSGSIZE). The largest
  // CachePD frame is a 2 MiB manifest (CACHEPD §3.3).
  int64_t max_frame_bytes = int64_t{4} << 20;
  // A message with more frames is read whole and dropped (a registration has 8, §3.2).
  size_t max_frames = 16;
  // When set, called (on a thread of the inbox's own) for each peer connection ZeroMQ cuts
  // rather than the peer closing it: a frame over max_frame_bytes or a ZMTP error, which
  // ZeroMQ otherwise drops in silence (inbox_watch.h). It must not block, nor call the inbox.
  OnConnectionCut on_connection_cut;
  // CURVE on: the inbox is a CURVE server with this keypair, and its context must have a ZAP
  // handler (ZmqContext::CreateWithZap). Null: no security, nothing changes on the wire.
  std::shared_ptr<const zmq_auth::KeyFile> curve_server;
};

// The PULL socket a rank binds (CACHEPD §1.1, §1.2).
//
// Thread-safe: Receive and Close take one mutex, so calls from several threads are serialised;
// a Close waits for a Receive in progress, at most that Receive's timeout. Typically one thread
// loops on Receive with a short timeout and checks its stop flag between calls.
class ZmqInbox {
 public:
  // Binds a PULL socket to tcp://<host>:<port> with linger 0. Port 0 picks a free port; the
  // endpoint actually bound is reported by endpoint() and port(). Fails (InvalidArgument) for
  // an empty host or a port outside 0..65535, (Unavailable) when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<ZmqInbox>> Bind(std::shared_ptr<ZmqContext> context,
                                                        absl::string_view host, int port,
                                                        InboxOptions options = {});
  ~ZmqInbox();

  // "tcp://<host>:<port>" as bound, with the real port.
  const std::string& endpoint() const { return endpoint_; }
  uint16_t port() const { return port_; }

  // Waits up to `timeout` (absl::InfiniteDuration() waits for ever) for one multipart
  // message and returns its frames; nullopt when none came in time (or a signal interrupted
  // the wait). Fails with InvalidArgument when a message was dropped for having more than
  // max_frames frames (the inbox stays usable: log it and call again), and with
  // FailedPrecondition after Close, or Unavailable when the context is being terminated.
  // `user_id` (optional) gets the message's authenticated User-Id with CURVE on ("decode:3:
  // decode-3", zmq_auth/key_file.h), and is cleared otherwise. `peer_host` (optional) gets the
  // sending peer's IP address (ZeroMQ's "Peer-Address" property), also for a message that was
  // dropped; empty if unknown.
  absl::StatusOr<std::optional<std::vector<std::string>>> Receive(absl::Duration timeout,
                                                                  std::string* user_id = nullptr,
                                                                  std::string* peer_host = nullptr);

  // The socket, for zmq_poll by the one thread that reads the inbox (a sidecar's engine API
  // thread: engine_api::ServerLoop::socket); valid until Close, which that thread's owner calls
  // only once it polls no more.
  void* poll_handle() const { return poll_handle_; }

  // Closes the socket, discarding what is queued; later Receives fail. Idempotent.
  void Close();

  struct Socket;

 private:
  ZmqInbox(std::shared_ptr<ZmqContext> context, InboxOptions options);

  std::shared_ptr<ZmqContext> context_;  // declared first: outlives the socket
  InboxOptions options_;
  std::mutex mu_;
  std::unique_ptr<Socket> socket_;     // guarded by mu_; null once closed
  std::unique_ptr<InboxWatch> watch_;  // guarded by mu_; stopped before the socket closes
  std::string endpoint_;
  uint16_t port_ = 0;
  void* poll_handle_ = nullptr;
};

struct OutboxOptions {
  // Messages queued per peer, sent or waiting for a connection, before Send fails
  // (ZMQ_SNDHWM).
  int send_hwm = 1000;
  // How long Send may wait for room in a full queue; zero never waits.
  absl::Duration send_timeout = absl::ZeroDuration();
  // When true, messages are queued only on a completed connection (ZMQ_IMMEDIATE), so a peer
  // that is not listening fails Send at once. When false (the reference's behaviour), messages
  // to a peer not yet or no longer connected are queued up to send_hwm, and are delivered once
  // it (re)connects.
  bool immediate = false;
  // How soon a lost connection is retried (ZMQ_RECONNECT_IVL).
  absl::Duration reconnect_interval = absl::Milliseconds(100);
  // CURVE on: every PUSH socket is a CURVE client with this keypair, of the server key given
  // for its endpoint with SetServerKey. Null: no security, nothing changes on the wire.
  std::shared_ptr<const zmq_auth::KeyFile> curve_client;
  // For tests: every message passes through this before it is sent. It may change the frames
  // (a peer with a bug, or one that holds the right keys and lies), or return false, and the
  // message is not sent while Send returns OK, as if it was lost on the way or its sender never
  // sent it (a peer of another version). Called on the sending thread. Empty: every message is
  // sent as it is.
  std::function<bool(std::vector<std::string>& frames)> intercept;
};

// PUSH sockets, one per peer endpoint, connected on first use and cached (CACHEPD §1.1), each
// with linger 0 (queued messages are dropped when it closes) and a send high-water mark.
//
// Thread-safe. Sends to one endpoint are serialised, so ZeroMQ keeps their order (a
// registration before the pre-allocations that rely on it, §1.3); sends to different endpoints
// do not wait for each other.
class ZmqOutbox {
 public:
  explicit ZmqOutbox(std::shared_ptr<ZmqContext> context, OutboxOptions options = {});
  ~ZmqOutbox();
  ZmqOutbox(const ZmqOutbox&) = delete;
  ZmqOutbox& operator=(const ZmqOutbox&) = delete;

  // Queues `frames` as one multipart message for the PULL socket at `endpoint`
  // ("tcp://host:port"). Never blocks longer than send_timeout. A message is queued whole or
  // not at all. Fails, sending nothing: InvalidArgument for no frames or an endpoint that is not
  // "tcp://host:port"; Unavailable when the peer's queue is full or, with `immediate`, the peer
  // is not connected (the message names the endpoint and the high-water mark); Unavailable
  // too when the context is being terminated.
  // With CURVE on, also FailedPrecondition when no server key was given for `endpoint`.
  absl::Status Send(absl::string_view endpoint, absl::Span<const std::string> frames);

  // CURVE on: the public key (Z85) of the PULL socket at `endpoint`, for the sockets made to
  // it from now on. A different key than before closes the cached socket (the peer restarted
  // with another key). Ignored with CURVE off.
  void SetServerKey(const std::string& endpoint, const std::string& public_key);

  // Closes the socket cached for `endpoint`, dropping what it still queues, and forgets its
  // server key. The next Send to it connects afresh (with CURVE on, after a SetServerKey).
  void Forget(absl::string_view endpoint);

  // Endpoints whose cached socket no Send has used since `since` (for the owner to Forget
  // those it no longer needs).
  std::vector<std::string> UnusedSince(absl::Time since) const;

  // Endpoints with a cached socket.
  size_t peer_count() const;

  struct Peer;

 private:
  std::shared_ptr<Peer> PeerFor(const std::string& endpoint, absl::Status& error);

  std::shared_ptr<ZmqContext> context_;  // declared first: outlives the sockets
  OutboxOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Peer>> peers_;  // guarded by mu_
  std::map<std::string, std::string> server_keys_;      // guarded by mu_; CURVE on only
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_ZMQ_CHANNEL_H_
