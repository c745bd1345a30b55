// The data-plane handshake beside CachePD (docs/ARCHITECTURE.md, "Handshake beside CachePD").
//
// A decode sidecar serves its transport's descriptor (proto/kvrail/v1/handshake.proto:
// transport, lanes, regions with base, length and remote key, a version) on a ZeroMQ endpoint
// whose "<ip>:<port>" is the session id it puts in frame 3 of its CachePD registration
// (CACHEPD §3.2). A prefill sidecar fetches the descriptor named by a registration's session id
// once, caches it (DescriptorCache), and fetches it again when the version changes or a
// connection fails. CachePD frames stay byte-identical.
//
// Wire (ZeroMQ ROUTER on the server, DEALER on the client), every frame raw bytes:
//   request: [ "kvrail.handshake.v1", <session id> ]
//   reply:   [ "kvrail.handshake.v1", "ok", <HandshakeDescriptor, serialised> ]
//          | [ "kvrail.handshake.v1", "error", <one line naming what was wrong> ]
// A request for another session id than the server's is answered with an error: the caller has
// a stale address, and must not write into another sidecar's memory.
#ifndef KVRAIL_ENGINE_TRANSPORT_HANDSHAKE_HANDSHAKE_H_
#define KVRAIL_ENGINE_TRANSPORT_HANDSHAKE_HANDSHAKE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/zmq_auth/curve.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

inline constexpr absl::string_view kHandshakeMagic = "kvrail.handshake.v1";
// The largest request a server reads (a session id is at most 512 bytes, CACHEPD §3.2) and the
// largest descriptor a client accepts.
inline constexpr int64_t kMaxHandshakeRequestBytes = 1024;
inline constexpr int64_t kMaxDescriptorBytes = int64_t{16} << 20;

struct SessionAddress {
  std::string host;
  int port = 0;
};

// Parses a CachePD session id "<host>:<port>" (CACHEPD §3.2, frame 3): 1 to 512 characters, a
// non-empty host of letters, digits, '.', '-' and '_' (IPv6 in brackets: "[::1]:5000"), and a
// canonical decimal port in [1, 65535]. InvalidArgument naming the rule otherwise.
absl::StatusOr<SessionAddress> ParseSessionId(absl::string_view session_id);

// Serves one descriptor source on tcp://<bind_host>:<port>, from a thread of its own.
class HandshakeServer {
 public:
  // Returns the descriptor to serve, fetched at each request so that a new version is served
  // as soon as the transport has one (Transport::LocalDescriptor).
  using Source = std::function<absl::StatusOr<v1::HandshakeDescriptor>()>;

  // Binds tcp://<bind_host>:<port> (port 0: an ephemeral port) and starts serving. The session
  // id is "<advertise_host>:<bound port>" (advertise_host defaults to bind_host; it must be
  // given when bind_host is "0.0.0.0" or "*"). Unavailable naming the endpoint when the bind
  // fails; InvalidArgument for a bad host or port. With `curve` (docs/SECURITY.md), the
  // endpoint is a CURVE server in a ZeroMQ context of its own, whose ZAP handler admits only
  // the keys `curve->zap` admits; without, nothing changes on the wire.
  static absl::StatusOr<std::unique_ptr<HandshakeServer>> Start(
      std::string bind_host, int port, Source source, std::string advertise_host = "",
      std::optional<zmq_auth::CurveServerKeys> curve = std::nullopt);

  ~HandshakeServer();  // Stop()
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  // What peers must put in CachePD frame 3 to reach this server.
  const std::string& session_id() const { return session_id_; }
  int port() const { return port_; }
  // Requests answered (with a descriptor or with an error).
  uint64_t requests_served() const { return served_.load(); }
  // Stops serving and joins the thread. Idempotent.
  void Stop();

 private:
  HandshakeServer() = default;
  void Run();

  Source source_;
  std::string session_id_;
  int port_ = 0;
  struct Sockets;
  std::unique_ptr<Sockets> sockets_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
};

// Fetches the descriptor served for `session_id`, waiting at most `timeout`. DeadlineExceeded
// when no answer came (nothing listens there, or the peer is gone); FailedPrecondition with the
// server's words when it answered with an error (another session id, no transport yet);
// DataLoss for a reply that is not a valid descriptor. Every message names the session id.
// With `curve`, the request goes only to the server holding `curve->server_public_key`'s
// secret (another server never answers: DeadlineExceeded).
absl::StatusOr<v1::HandshakeDescriptor> FetchDescriptor(
    absl::string_view session_id, absl::Duration timeout,
    const zmq_auth::CurveClientKeys* curve = nullptr);

// One session for FetchDescriptors: its id and, with CURVE, the keys its request goes with
// (borrowed for the call).
struct FetchTarget {
  std::string session_id;
  const zmq_auth::CurveClientKeys* curve = nullptr;
};

// FetchDescriptor for many sessions at once, in at most `timeout` together: a hundred silent
// peers cost one timeout, not a hundred. The answers are in the order of `targets`, each as
// FetchDescriptor would give it.
std::vector<absl::StatusOr<v1::HandshakeDescriptor>> FetchDescriptors(
    const std::vector<FetchTarget>& targets, absl::Duration timeout);

// The prefill side's cache of peers' descriptors, one per session id. Thread-safe.
class DescriptorCache {
 public:
  using Fetcher = std::function<absl::StatusOr<v1::HandshakeDescriptor>(absl::string_view)>;

  // `fetcher` defaults to FetchDescriptor with `timeout`.
  explicit DescriptorCache(absl::Duration timeout = absl::Seconds(5), Fetcher fetcher = nullptr);

  // The cached descriptor of `session_id`, fetched on first use. A failed fetch is not cached.
  absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> Get(const std::string& session_id);
  // Fetches again and replaces the cached copy: after a connection failure, or when a write
  // falls outside the cached regions (the peer may have registered more). The new descriptor
  // is returned whatever its version; `changed` (optional) says whether the version differs
  // from the cached one.
  absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> Refresh(
      const std::string& session_id, bool* changed = nullptr);
  // Forgets `session_id`: the next Get fetches.
  void Invalidate(const std::string& session_id);

  uint64_t fetches() const;

 private:
  Fetcher fetcher_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const v1::HandshakeDescriptor>> cached_;
  uint64_t fetches_ = 0;
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_HANDSHAKE_HANDSHAKE_H_
