// The engine API endpoint (proto/kvrail/v1/engine.proto): the sidecar's ROUTER socket that an
// engine rank drives, and the C++ client engines (and `kvrail engine-sim`) use.
#ifndef KVRAIL_CONTROL_ENGINE_API_ENGINE_API_H_
#define KVRAIL_CONTROL_ENGINE_API_ENGINE_API_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/zmq_auth/curve.h"
#include "proto/kvrail/v1/engine.pb.h"

namespace kvrail::engine_api {

// Requests larger than this are refused by the socket (a manifest is at most 2 MiB, CACHEPD
// §7.4; a contract 256 KiB).
inline constexpr int64_t kMaxRequestBytes = int64_t{4} << 20;

// For EngineApiServer::Start: when `fd` is set, the server's thread also runs another loop's
// work. It calls `adopt` once, first; polls `fd` beside its socket; and calls `run` when `fd` is
// readable, and once more after Stop (a sidecar's room owner runs this way:
// control/sidecar/owner_loop.h, Driven).
struct ServerLoop {
  int fd = -1;
  std::function<void()> adopt;
  std::function<void()> run;
  // When set, a ZeroMQ socket the loop reads too (a sidecar's CachePD inbox: ZmqInbox::
  // poll_handle): polled beside the server's own while it serves, `read` called when it is
  // readable. `read` takes what it wants of it; what it leaves wakes the next poll at once.
  void* socket = nullptr;
  std::function<void()> read;
};

class EngineApiServer {
  struct Mailbox;

 public:
  // Answers one request. Runs on the server's thread: it must not block for long.
  using Handler = std::function<v1::EngineReply(const v1::EngineRequest&)>;

  // The answer to one request, given later from any thread: the reply goes to the engine that
  // asked, with its request_id. Call it once; copies share the one answer (a second call is
  // ignored). A reply after Stop, or to an engine that went away, is dropped.
  class Responder {
   public:
    void operator()(v1::EngineReply reply) const;

   private:
    friend class EngineApiServer;
    std::shared_ptr<Mailbox> mailbox_;
    std::string identity_;
    uint64_t request_id_ = 0;
    std::shared_ptr<std::atomic<bool>> answered_;
  };

  // Offered each request before the Handler, on the server's thread: returns true when it took
  // the request and will answer it through the Responder (what may take long, such as parsing
  // a large manifest, then runs elsewhere while the server answers other requests); false to
  // leave it to the Handler.
  using Deferrer = std::function<bool(const v1::EngineRequest&, const Responder&)>;

  // Binds `endpoint` ("ipc:///tmp/kvrail-p0.sock", "tcp://127.0.0.1:0") and starts serving.
  // Unavailable naming the endpoint when the bind fails. With `curve` (docs/SECURITY.md: for
  // tcp, an ipc socket is its owner's already), the socket is a CURVE server in a ZeroMQ
  // context of its own, which admits only the engine keys `curve->zap` admits.
  //
  static absl::StatusOr<std::unique_ptr<EngineApiServer>> Start(
      const std::string& endpoint, Handler handler, Deferrer deferrer = nullptr,
      std::optional<zmq_auth::CurveServerKeys> curve = std::nullopt, ServerLoop loop = {});
  ~EngineApiServer();  // Stop()
  EngineApiServer(const EngineApiServer&) = delete;
  EngineApiServer& operator=(const EngineApiServer&) = delete;

  // The bound endpoint (with the real port for tcp port 0).
  const std::string& endpoint() const { return endpoint_; }

  // One engine per sidecar: the first to send a request (other than Stats) drives it; another
  // identity's requests are refused, but for Stats (open to any, for monitoring) and
  // AttachArena, which, once the handler accepts it (a restarted engine attaching its arena
  // again), makes that identity the engine. While the engine is still connected (a message
  // sent to it is routable), such an AttachArena must carry the engine token that every
  // accepted AttachArena's reply carries, so that another process that reaches the socket
  // cannot take the sidecar over.
  //
  // Queues `event` for the engine, if it is still connected (an engine that went away is
  // forgotten at the first event it cannot take). Thread-safe; never blocks.
  void Publish(const v1::RoomEvent& event);

  // The engine driving the sidecar: 1, or 0 before the first or once it was found gone.
  size_t engines() const { return engines_.load(); }

  // Requests refused because another engine drives the sidecar.
  uint64_t refused() const { return refused_.load(); }

  // Malformed requests answered with an error so far.
  uint64_t malformed() const { return malformed_.load(); }

  // Takes no more requests; the thread goes on delivering events and running `loop`'s work
  // until Stop.
  void StopServing() { serving_.store(false); }
  // Closes the socket and joins the thread. An ipc endpoint's socket file is removed, unless
  // another server has bound that path since.
  void Stop();

 private:
  EngineApiServer() = default;
  void Run();

  // Sends what the mailbox holds: events to the engine, replies to whoever asked.
  void Deliver();
  // Server thread: whether `identity` may make `request` (one engine per sidecar); when not,
  // `reply` says why.
  bool Admit(const std::string& identity, const v1::EngineRequest& request,
             v1::SidecarMessage& reply);
  // Server thread: whether the engine can still be sent to (an empty message, which clients
  // ignore); forgets it when not.
  bool EngineConnected();

  Handler handler_;
  Deferrer deferrer_;
  std::string endpoint_;
  std::string engine_token_;  // 32 hex digits from getrandom(2), made at Start
  struct Sockets;
  std::unique_ptr<Sockets> sockets_;
  // Shared with the Responders, which may outlive the server (a deferred answer finishing
  // after Stop): it owns the eventfd that wakes the server thread.
  std::shared_ptr<Mailbox> mailbox_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> serving_{true};
  ServerLoop loop_;
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<size_t> engines_{0};
  std::thread thread_;
};

// A single-threaded client: one DEALER socket to a sidecar.
//
// Liveness (docs/ENGINE-API.md, "When the sidecar goes away", as the Python client): the
// connection's own signal (a sidecar process that died closes it), and with a heartbeat timeout
// given to Connect, ZeroMQ heartbeats too (a sidecar stopped or cut off stops answering them;
// unlike the Python client, this one does not attach again when such a sidecar comes back, so
// without a heartbeat a stopped sidecar that resumes keeps its engine). When the connection
// is lost, every room the
// engine began through this client (an accepted Begin, Ready, LayersReady or Expect) that has
// not ended comes out of NextEvent/NextMessage as Failed, the reason saying the sidecar is lost,
// with pages REUSABLE when the sidecar process (EngineReply.sidecar_pid) is gone and HELD while
// it may still exist; Call fails with Unavailable at once until the connection is back.
class EngineApiClient {
 public:
  // With `curve`, a CURVE client of the sidecar's public key (its engine key and the
  // sidecar's .pub: `kvrail engine-sim --curve-key --curve-server-key`).
  static absl::StatusOr<std::unique_ptr<EngineApiClient>> Connect(
      const std::string& endpoint, const zmq_auth::CurveClientKeys* curve = nullptr,
      absl::Duration heartbeat_timeout = absl::ZeroDuration());
  ~EngineApiClient();
  EngineApiClient(const EngineApiClient&) = delete;
  EngineApiClient& operator=(const EngineApiClient&) = delete;

  // Sends `request` (its request_id is set here) and waits for the reply; events arriving
  // meanwhile are kept for NextEvent. DeadlineExceeded when no reply came in `timeout`;
  // FailedPrecondition with the sidecar's words when the reply carries an error.
  absl::StatusOr<v1::EngineReply> Call(v1::EngineRequest request,
                                       absl::Duration timeout = absl::Seconds(10));

  // The next room event, waiting at most `timeout`; nullopt on timeout. Replies to requests
  // made with Send that arrive meanwhile are kept for NextMessage.
  std::optional<v1::RoomEvent> NextEvent(absl::Duration timeout);

  // Asynchronous use: pipelines requests without waiting for each reply.
  //
  // Sends `request` (its request_id is set here and returned) and returns at once; its reply
  // comes back through NextMessage. Unavailable when the socket refuses the message.
  absl::StatusOr<uint64_t> Send(v1::EngineRequest request);

  // The next message from the sidecar, waiting at most `timeout` (zero: only what has
  // arrived): a reply to a Send (check its error) or a room event, in arrival order, after the
  // events Call kept. Replies to abandoned Calls are skipped. nullopt on timeout; Unavailable
  // when the socket fails.
  absl::StatusOr<std::optional<v1::SidecarMessage>> NextMessage(absl::Duration timeout);

  // Requests sent with Send whose replies NextMessage has not returned yet.
  size_t pending_replies() const { return sent_.size(); }

  // Why the connection to the sidecar is lost, while it is.
  const std::optional<std::string>& lost() const { return lost_; }

 private:
  EngineApiClient() = default;
  // Receives one message, waiting at most `timeout`; false on timeout.
  bool Receive(absl::Duration timeout, v1::SidecarMessage& out);
  // Keeps `message` for NextMessage/NextEvent when it is an event or the reply to a Send.
  void Keep(v1::SidecarMessage message);
  // Handles what the connection's monitor reported: the sidecar lost (the open rooms' Failed
  // events are kept), or back.
  void Watch();
  // An accepted request: the room it begins, and the sidecar's pid from an attach.
  void Accepted(const v1::EngineRequest& request, const v1::EngineReply& reply);

  struct Sockets;
  std::unique_ptr<Sockets> sockets_;
  std::string endpoint_;
  uint64_t next_id_ = 1;
  // Events and replies to Sends received but not yet returned, in arrival order.
  std::deque<v1::SidecarMessage> kept_;
  // request_ids sent with Send and not yet answered through NextMessage.
  absl::flat_hash_set<uint64_t> sent_;
  // Liveness: the rooms begun here that have not ended for the engine, with what it was told
  // of them (as the Python client's RoomLedger): nothing yet; Failed by the sidecar, pages
  // held (its release notice follows); or Failed by this client when the connection was lost,
  // pages held (orphaned: the sidecar's own outcome, once it is back, only releases them).
  enum class OpenRoom { kActive, kHeld, kOrphaned };
  absl::flat_hash_map<uint64_t, OpenRoom> open_rooms_;
  // The sidecar's pid, whether the connection is up, and why it is lost.
  uint32_t sidecar_pid_ = 0;
  bool connected_ = false;
  std::optional<std::string> lost_;
};

}  // namespace kvrail::engine_api

#endif  // KVRAIL_CONTROL_ENGINE_API_ENGINE_API_H_
