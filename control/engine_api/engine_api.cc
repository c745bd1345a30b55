#include "control/engine_api/engine_api.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/sync/thread_name.h"

namespace kvrail::engine_api {
namespace {

// Compares in time independent of where the strings differ (the engine token is a secret).
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

zmq::context_t& Context() {
  static zmq::context_t* context = new zmq::context_t(1);
  return *context;
}

}  // namespace

// What other threads hand the server thread: events to publish and deferred replies.
struct EngineApiServer::Mailbox {
  ~Mailbox() {
    if (wake_fd >= 0) close(wake_fd);
  }
  void Wake() const {
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }
  // Needs mu: whether a message queued now must Wake the server thread. Only the first into an
  // empty mailbox must: the server reads the eventfd before it takes everything queued, so
  // whatever joins a mailbox already woken for is taken with it (one write(2) and one wakeup
  // per batch rather than per event).
  bool EmptyLocked() const { return events.empty() && replies.empty(); }
  int wake_fd = -1;  // eventfd
  std::mutex mu;
  bool closed = false;                                      // Stop ran: drop what comes
  std::deque<std::string> events;                           // serialised SidecarMessage events
  std::deque<std::pair<std::string, std::string>> replies;  // (identity, SidecarMessage)
};

void EngineApiServer::Responder::operator()(v1::EngineReply reply) const {
  if (mailbox_ == nullptr || answered_->exchange(true)) return;
  v1::SidecarMessage message;
  *message.mutable_reply() = std::move(reply);
  message.mutable_reply()->set_request_id(request_id_);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    if (mailbox_->closed) return;
    wake = mailbox_->EmptyLocked();
    mailbox_->replies.emplace_back(identity_, message.SerializeAsString());
  }
  if (wake) mailbox_->Wake();
}

struct EngineApiServer::Sockets {
  // With CURVE on: a context of its own and its ZAP handler, declared before the router so
  // that the router closes, then the handler stops, before the context terminates.
  std::unique_ptr<zmq::context_t> context;
  std::unique_ptr<zmq_auth::ZapHandler> zap;
  zmq::socket_t router;
  std::set<std::string> engines;  // the one engine driving the sidecar, or none (server thread)
  // An ipc endpoint's socket file and the inode the bind made there ("" for tcp): Stop removes
  // it when it is still that inode. ZeroMQ removes it too, but only once its I/O thread gets to
  // the closed socket, which a process that exits right after Stop never lets it do.
  std::string socket_file;
  dev_t socket_device = 0;
  ino_t socket_inode = 0;
};

absl::StatusOr<std::unique_ptr<EngineApiServer>> EngineApiServer::Start(
    const std::string& endpoint, Handler handler, Deferrer deferrer,
    std::optional<zmq_auth::CurveServerKeys> curve, ServerLoop loop) {
  if (!handler) return absl::InvalidArgumentError("engine API server: the handler is empty");
  std::unique_ptr<EngineApiServer> server(new EngineApiServer);
  unsigned char random[16];
  if (getrandom(random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return absl::InternalError(
        absl::StrCat("engine API: getrandom for the engine token failed: ", std::strerror(errno)));
  }
  server->engine_token_ = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(random), sizeof(random)));
  server->handler_ = std::move(handler);
  server->deferrer_ = std::move(deferrer);
  server->loop_ = std::move(loop);
  server->sockets_ = std::make_unique<Sockets>();
  zmq::context_t* context = &Context();
  if (curve) {
    server->sockets_->context = std::make_unique<zmq::context_t>(1);
    context = server->sockets_->context.get();
    absl::StatusOr<std::unique_ptr<zmq_auth::ZapHandler>> zap =
        zmq_auth::ZapHandler::Start(context->handle(), std::move(curve->zap));
    if (!zap.ok()) return zap.status();
    server->sockets_->zap = *std::move(zap);
  }
  try {
    zmq::socket_t router(*context, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    if (curve) {
      if (absl::Status ok = zmq_auth::MakeCurveServer(router.handle(), curve->own); !ok.ok()) {
        return ok;
      }
    }
    router.set(zmq::sockopt::maxmsgsize, kMaxRequestBytes);
    router.set(zmq::sockopt::sndhwm, 100000);
    // Sending to an engine that went away fails (EHOSTUNREACH) instead of vanishing: its
    // identity is then forgotten, so engines that reconnect do not pile up.
    router.set(zmq::sockopt::router_mandatory, true);
    router.bind(endpoint);
    server->endpoint_ = router.get(zmq::sockopt::last_endpoint);
    server->sockets_->router = std::move(router);
    // An ipc socket is its owner's alone: no other user on the host can connect to it.
    if (absl::StartsWith(server->endpoint_, "ipc://")) {
      const std::string path = server->endpoint_.substr(6);
      struct stat bound {};
      if (stat(path.c_str(), &bound) == 0) {  // from here on, Stop removes it: a refusal too
        server->sockets_->socket_file = path;
        server->sockets_->socket_device = bound.st_dev;
        server->sockets_->socket_inode = bound.st_ino;
      }
      if (chmod(path.c_str(), S_IRUSR | S_IWUSR) != 0) {
        return absl::UnavailableError(
            absl::StrCat("engine API: chmod 0600 ", path, " failed: ", std::strerror(errno)));
      }
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("engine API: bind ", endpoint, " failed: ", e.what()));
  }
  server->mailbox_ = std::make_shared<Mailbox>();
  server->mailbox_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->mailbox_->wake_fd < 0) return absl::InternalError("engine API: eventfd failed");
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  NameThread(server->thread_, "kvrail-engapi");
  return server;
}

EngineApiServer::~EngineApiServer() { Stop(); }

void EngineApiServer::Stop() {
  stop_.store(true);
  if (mailbox_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(mailbox_->mu);
      mailbox_->closed = true;
    }
    mailbox_->Wake();
  }
  if (thread_.joinable()) thread_.join();
  if (sockets_ != nullptr) {
    sockets_->router.close();
    sockets_->zap.reset();
    // The socket file goes with the socket, unless another server has bound the path since
    // (ZeroMQ's bind replaces a file left there): that one is not ours to remove.
    struct stat now {};
    if (!sockets_->socket_file.empty() && stat(sockets_->socket_file.c_str(), &now) == 0 &&
        now.st_dev == sockets_->socket_device && now.st_ino == sockets_->socket_inode) {
      (void)unlink(sockets_->socket_file.c_str());
    }
    sockets_->socket_file.clear();
  }
}

void EngineApiServer::Publish(const v1::RoomEvent& event) {
  v1::SidecarMessage message;
  *message.mutable_event() = event;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    if (mailbox_->closed) return;
    wake = mailbox_->EmptyLocked();
    mailbox_->events.push_back(message.SerializeAsString());
  }
  if (wake) mailbox_->Wake();
}

bool EngineApiServer::EngineConnected() {
  std::set<std::string>& engines = sockets_->engines;
  if (engines.empty()) return false;
  const std::string empty = v1::SidecarMessage().SerializeAsString();
  try {
    sockets_->router.send(zmq::buffer(*engines.begin()),
                          zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    sockets_->router.send(zmq::buffer(empty), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    if (e.num() != EHOSTUNREACH) return true;  // a full queue (EAGAIN): still there
    engines.clear();
    engines_.store(0);
    return false;
  }
  return true;
}

bool EngineApiServer::Admit(const std::string& identity, const v1::EngineRequest& request,
                            v1::SidecarMessage& reply) {
  std::set<std::string>& engines = sockets_->engines;  // the one engine, or none yet
  if (engines.count(identity) > 0 || request.has_stats()) return true;
  if (request.has_attach()) {
    const std::string& token = request.attach().engine_token();
    const bool holds_token = SameToken(token, engine_token_);
    if (engines.empty() || holds_token || !EngineConnected()) return true;
    refused_.fetch_add(1);
    reply.mutable_reply()->set_request_id(request.request_id());
    reply.mutable_reply()->set_error(
        "engine API: AttachArena refused: another engine drives this sidecar and is still "
        "connected; a client takes over from it only with the engine token of an accepted "
        "AttachArena's reply (AttachArena.engine_token)");
    return false;
  }
  if (engines.empty()) {
    engines.insert(identity);  // the first engine to ask drives this sidecar
    engines_.store(1);
    return true;
  }
  refused_.fetch_add(1);
  reply.mutable_reply()->set_request_id(request.request_id());
  reply.mutable_reply()->set_error(
      "engine API: another engine drives this sidecar; a second one is refused (a restarted "
      "engine takes over by attaching its arena again; Stats is open to any)");
  return false;
}

void EngineApiServer::Deliver() {
  uint64_t count;
  (void)!read(mailbox_->wake_fd, &count, sizeof(count));
  std::deque<std::string> events;
  std::deque<std::pair<std::string, std::string>> replies;
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    events.swap(mailbox_->events);
    replies.swap(mailbox_->replies);
  }
  zmq::socket_t& router = sockets_->router;
  for (const auto& [identity, bytes] : replies) {
    try {
      router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
      // The engine went away (or its queue is full) while its request was being answered.
    }
  }
  for (const std::string& event : events) {
    for (auto engine = sockets_->engines.begin(); engine != sockets_->engines.end();) {
      try {
        router.send(zmq::buffer(*engine), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        router.send(zmq::buffer(event), zmq::send_flags::dontwait);
        ++engine;
      } catch (const zmq::error_t& e) {
        if (e.num() == EHOSTUNREACH) {
          engine = sockets_->engines.erase(engine);  // that engine is gone
          engines_.store(sockets_->engines.size());
        } else {
          ++engine;  // its queue is full (EAGAIN): this event is dropped for it
        }
      }
    }
  }
}

void EngineApiServer::Run() {
  zmq::socket_t& router = sockets_->router;
  const bool looped = loop_.fd >= 0;
  if (looped) loop_.adopt();
  while (!stop_.load()) {
    // A server that stopped serving polls nothing of its socket: requests wait there unread.
    const bool serving = serving_.load();
    const bool reads = looped && serving && loop_.socket != nullptr;
    zmq::pollitem_t items[4] = {
        {serving ? router.handle() : nullptr, serving ? 0 : -1, ZMQ_POLLIN, 0},
        {nullptr, mailbox_->wake_fd, ZMQ_POLLIN, 0},
        {nullptr, loop_.fd, ZMQ_POLLIN, 0},
        {loop_.socket, 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, reads ? 4 : (looped ? 3 : 2), std::chrono::milliseconds(100));
      if (looped && (items[2].revents & ZMQ_POLLIN)) loop_.run();
      if (reads && (items[3].revents & ZMQ_POLLIN)) loop_.read();
      if (items[1].revents & ZMQ_POLLIN) Deliver();
      if (!serving || !(items[0].revents & ZMQ_POLLIN)) continue;
      while (true) {
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(router, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          break;
        }
        if (frames.empty()) continue;
        const std::string identity = frames[0].to_string();
        v1::SidecarMessage reply;
        v1::EngineRequest request;
        if (frames.size() != 2 ||
            !request.ParseFromArray(frames[1].data(), static_cast<int>(frames[1].size()))) {
          malformed_.fetch_add(1);
          reply.mutable_reply()->set_error(
              absl::StrCat("engine API: expected one frame holding a kvrail.v1.EngineRequest, got ",
                           frames.size() - 1, " frame(s) that do not parse"));
        } else if (request.kind_case() == v1::EngineRequest::KIND_NOT_SET) {
          malformed_.fetch_add(1);
          reply.mutable_reply()->set_request_id(request.request_id());
          reply.mutable_reply()->set_error(
              "engine API: the request names no operation (attach, ready, expect, poll, abort, "
              "stats)");
        } else if (!Admit(identity, request, reply)) {
          // Another engine drives this sidecar: refused (see Admit).
        } else {
          if (deferrer_) {
            Responder later;
            later.mailbox_ = mailbox_;
            later.identity_ = identity;
            later.request_id_ = request.request_id();
            later.answered_ = std::make_shared<std::atomic<bool>>(false);
            if (deferrer_(request, later)) continue;  // answered through `later`
          }
          *reply.mutable_reply() = handler_(request);
          reply.mutable_reply()->set_request_id(request.request_id());
          // An accepted AttachArena from another identity is a restarted engine taking over.
          if (request.has_attach() && reply.reply().error().empty()) {
            reply.mutable_reply()->set_engine_token(engine_token_);
            reply.mutable_reply()->set_sidecar_pid(static_cast<uint32_t>(getpid()));
            if (sockets_->engines.empty() || *sockets_->engines.begin() != identity) {
              sockets_->engines = {identity};
              engines_.store(1);
            }
          }
        }
        const std::string bytes = reply.SerializeAsString();
        router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        router.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
      }
    } catch (const zmq::error_t&) {
      // An engine that went away between request and reply: nothing to answer.
    }
  }
  if (looped) loop_.run();  // what the loop's owner left queued at Stop
}

struct EngineApiClient::Sockets {
  zmq::socket_t dealer;
  zmq::socket_t monitor;  // the dealer's connection events (zmq_socket_monitor)
};

namespace {

// Whether the sidecar process `pid` is gone (or the pid is another program's now); nullopt
// when unknown. As python/kvrail_engine/liveness.py.
std::optional<bool> SidecarProcessGone(uint32_t pid) {
  if (pid == 0) return std::nullopt;
  if (kill(static_cast<pid_t>(pid), 0) != 0) {
    if (errno == ESRCH) return true;
    return false;  // EPERM: it exists
  }
  std::ifstream cmdline(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  if (!cmdline) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(cmdline)),
                         std::istreambuf_iterator<char>());
  return text.find("sidecar") == std::string::npos;
}

// The room an accepted request begins (or continues), if any.
std::optional<uint64_t> BegunRoom(const v1::EngineRequest& request) {
  if (request.has_begin()) return request.begin().room();
  if (request.has_ready()) return request.ready().room();
  if (request.has_layers_ready()) return request.layers_ready().room();
  if (request.has_expect()) return request.expect().room();
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineApiClient>> EngineApiClient::Connect(
    const std::string& endpoint, const zmq_auth::CurveClientKeys* curve,
    absl::Duration heartbeat_timeout) {
  std::unique_ptr<EngineApiClient> client(new EngineApiClient);
  client->sockets_ = std::make_unique<Sockets>();
  client->endpoint_ = endpoint;
  try {
    zmq::socket_t dealer(Context(), zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::rcvhwm, 100000);
    if (heartbeat_timeout > absl::ZeroDuration()) {
      const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(heartbeat_timeout));
      dealer.set(zmq::sockopt::heartbeat_ivl, std::max(1, timeout_ms / 3));
      dealer.set(zmq::sockopt::heartbeat_timeout, std::max(1, timeout_ms));
    }
    // A connection counts once its handshake succeeded: a stopped sidecar's kernel still
    // accepts the connection itself.
    // Unique for the process's life: an inproc endpoint is unbound only some time after its
    // monitor stops, so a later client must not reuse the name.
    static std::atomic<uint64_t> monitors{0};
    const std::string monitor_endpoint =
        absl::StrCat("inproc://kvrail-engine-api-monitor-", monitors.fetch_add(1));
    if (zmq_socket_monitor(dealer.handle(), monitor_endpoint.c_str(),
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) != 0) {
      return absl::InternalError(
          absl::StrCat("engine API: zmq_socket_monitor failed: ", zmq_strerror(zmq_errno())));
    }
    zmq::socket_t monitor(Context(), zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(monitor_endpoint);
    client->sockets_->monitor = std::move(monitor);
    if (curve != nullptr) {
      absl::Status ok =
          zmq_auth::MakeCurveClient(dealer.handle(), curve->own, curve->server_public_key);
      if (!ok.ok()) return ok;
    }
    dealer.connect(endpoint);
    client->sockets_->dealer = std::move(dealer);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("engine API: connect ", endpoint, " failed: ", e.what()));
  }
  return client;
}

EngineApiClient::~EngineApiClient() {
  if (sockets_ != nullptr && sockets_->dealer.handle() != nullptr) {
    zmq_socket_monitor(sockets_->dealer.handle(), nullptr, 0);
  }
}

namespace {

// A Failed event this client makes for `room` itself (the sidecar lost or gone).
v1::SidecarMessage ClientFailed(uint64_t room, v1::PageState pages, std::string reason) {
  v1::SidecarMessage message;
  v1::RoomEvent* failed = message.mutable_event();
  failed->set_room(room);
  failed->set_status(v1::TRANSFER_POLL_FAILED);
  failed->set_bootstrap_token(-1);
  failed->set_pages(pages);
  failed->set_reason(std::move(reason));
  return message;
}

// The release notice of a room the engine was told Failed with its pages held: they are the
// engine's again (proven: nothing of the room can land any more).
v1::SidecarMessage ClientReleased(uint64_t room, std::string reason, bool proven) {
  v1::SidecarMessage message = ClientFailed(room, v1::PAGES_REUSABLE, std::move(reason));
  message.mutable_event()->set_status(v1::TRANSFER_POLL_PAGES_RELEASED);  // not a second Failed
  message.mutable_event()->set_pages_released(true);
  message.mutable_event()->set_pages_proven(proven);
  return message;
}

}  // namespace

void EngineApiClient::Watch() {
  zmq::socket_t& monitor = sockets_->monitor;
  while (true) {
    zmq::message_t event;
    if (!monitor.recv(event, zmq::recv_flags::dontwait)) return;
    zmq::message_t address;
    (void)monitor.recv(address, zmq::recv_flags::none);  // always follows the event frame
    if (event.size() < 2) continue;
    uint16_t id = 0;
    std::memcpy(&id, event.data(), sizeof(id));
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      const bool was_lost = lost_.has_value();
      connected_ = true;
      lost_.reset();
      // Back: when the process the orphaned rooms were begun on is gone (a sidecar restarted
      // at the same endpoint), nothing of them can land, and their pages are released now. The
      // same process ends them itself, and Keep turns its outcomes into their releases.
      if (was_lost && SidecarProcessGone(sidecar_pid_).value_or(false)) {
        std::vector<uint64_t> orphaned;
        for (const auto& [room, open] : open_rooms_) {
          if (open == OpenRoom::kOrphaned) orphaned.push_back(room);
        }
        std::sort(orphaned.begin(), orphaned.end());
        for (uint64_t room : orphaned) {
          kept_.push_back(
              ClientReleased(room, "pages released: the sidecar that held the room is gone", true));
          open_rooms_.erase(room);
        }
      }
      continue;
    }
    if (id != ZMQ_EVENT_DISCONNECTED || !connected_) continue;
    connected_ = false;
    lost_ = absl::StrCat("engine API ", endpoint_,
                         ": the sidecar is lost (its connection closed, or it answered no "
                         "heartbeat in time)");
    const bool gone = SidecarProcessGone(sidecar_pid_).value_or(false);
    std::vector<std::pair<uint64_t, OpenRoom>> rooms(open_rooms_.begin(), open_rooms_.end());
    std::sort(rooms.begin(), rooms.end());
    for (const auto& [room, open] : rooms) {
      if (gone) {
        // Told Failed (held) already: the release notice, not a second Failed.
        kept_.push_back(
            open == OpenRoom::kActive
                ? ClientFailed(room, v1::PAGES_REUSABLE,
                               absl::StrCat(*lost_,
                                            "; the sidecar process is gone, so "
                                            "nothing of the room can land"))
                : ClientReleased(room, "pages released: the sidecar process is gone", true));
        open_rooms_.erase(room);
      } else if (open == OpenRoom::kActive) {
        kept_.push_back(ClientFailed(room, v1::PAGES_HELD,
                                     absl::StrCat(*lost_,
                                                  "; a write of the room may still land until "
                                                  "the sidecar is back or known gone")));
        open_rooms_[room] = OpenRoom::kOrphaned;
      }
    }
  }
}

void EngineApiClient::Accepted(const v1::EngineRequest& request, const v1::EngineReply& reply) {
  if (request.has_attach()) sidecar_pid_ = reply.sidecar_pid();
  if (const std::optional<uint64_t> room = BegunRoom(request)) {
    open_rooms_.try_emplace(*room, OpenRoom::kActive);
  }
}

bool EngineApiClient::Receive(absl::Duration timeout, v1::SidecarMessage& out) {
  zmq::socket_t& dealer = sockets_->dealer;
  zmq::message_t message;
  const absl::Time deadline = absl::Now() + timeout;
  zmq::socket_t& monitor = sockets_->monitor;
  // What has arrived already needs no poll (pipelined clients drain many messages per wake).
  while (!dealer.recv(message, zmq::recv_flags::dontwait)) {
    // The monitor's news first: a lost sidecar's rooms become Failed events (kept_), which
    // the caller looks at before waiting again.
    const size_t kept = kept_.size();
    Watch();
    if (kept_.size() != kept) return false;
    // The sockets' ZMQ_FDs are edge-triggered: wait on them only once ZMQ_EVENTS says nothing
    // is readable (reading ZMQ_EVENTS rearms them). ppoll waits to the microsecond, where
    // zmq_poll counts whole milliseconds (sub-millisecond timeouts would spin or wait too long).
    if (dealer.get(zmq::sockopt::events) & ZMQ_POLLIN) continue;
    if (monitor.get(zmq::sockopt::events) & ZMQ_POLLIN) continue;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd fds[2] = {{dealer.get(zmq::sockopt::fd), POLLIN, 0},
                     {monitor.get(zmq::sockopt::fd), POLLIN, 0}};
    const timespec wait = absl::ToTimespec(left);
    ppoll(fds, 2, &wait, nullptr);
  }
  return out.ParseFromArray(message.data(), static_cast<int>(message.size()));
}

void EngineApiClient::Keep(v1::SidecarMessage message) {
  if (message.has_event()) {
    const v1::RoomEvent& event = message.event();
    auto open = open_rooms_.find(event.room());
    if (open != open_rooms_.end()) {
      const bool pages_free =
          event.status() == v1::TRANSFER_POLL_SUCCESS || event.pages_released() ||
          (event.status() == v1::TRANSFER_POLL_FAILED && event.pages() != v1::PAGES_HELD);
      if (open->second == OpenRoom::kOrphaned) {
        // The engine was told Failed when the connection was lost: the sidecar's own outcome is
        // not a second terminal event, only, once the pages are free, their release.
        if (!pages_free) return;  // held by the sidecar now: its release follows
        const bool proven = event.pages_proven() || event.pages() != v1::PAGES_HELD;
        message = ClientReleased(
            event.room(),
            absl::StrCat(
                "pages released: the sidecar ended the room (",
                event.reason().empty() ? v1::TransferPoll_Name(event.status()) : event.reason(),
                ") after it came back"),
            proven);
        open_rooms_.erase(open);
      } else if (pages_free) {
        open_rooms_.erase(open);
      } else if (event.status() == v1::TRANSFER_POLL_FAILED) {
        open->second = OpenRoom::kHeld;  // its release follows
      }
    }
  }
  if (message.has_event() ||
      (message.has_reply() && sent_.contains(message.reply().request_id()))) {
    kept_.push_back(std::move(message));
  }
}

absl::StatusOr<v1::EngineReply> EngineApiClient::Call(v1::EngineRequest request,
                                                      absl::Duration timeout) {
  Watch();
  if (lost_) {
    // A sidecar restarted at the same endpoint may be a handshake away: wait for it a little
    // (the heartbeat timeout) before refusing.
    const absl::Time until = absl::Now() + std::min(timeout, absl::Seconds(3));
    while (lost_ && absl::Now() < until) {
      pollfd fd{sockets_->monitor.get(zmq::sockopt::fd), POLLIN, 0};
      const timespec wait = absl::ToTimespec(absl::Milliseconds(20));
      if (!(sockets_->monitor.get(zmq::sockopt::events) & ZMQ_POLLIN))
        ppoll(&fd, 1, &wait, nullptr);
      Watch();
    }
    if (lost_) return absl::UnavailableError(*lost_);
  }
  const uint64_t id = next_id_++;
  request.set_request_id(id);
  const std::string bytes = request.SerializeAsString();
  try {
    sockets_->dealer.send(zmq::buffer(bytes), zmq::send_flags::none);
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      v1::SidecarMessage message;
      if (!Receive(deadline - absl::Now(), message)) {
        if (lost_) return absl::UnavailableError(*lost_);
        continue;
      }
      if (!message.has_reply() || message.reply().request_id() != id) {
        Keep(std::move(message));  // an event, a Send's reply, or one to an abandoned call
        continue;
      }
      if (!message.reply().error().empty()) {
        return absl::FailedPreconditionError(message.reply().error());
      }
      Accepted(request, message.reply());
      return message.reply();
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("engine API ", endpoint_, ": ", e.what()));
  }
  return absl::DeadlineExceededError(absl::StrCat("engine API ", endpoint_, ": no reply within ",
                                                  absl::FormatDuration(timeout),
                                                  " (is the sidecar running?)"));
}

std::optional<v1::RoomEvent> EngineApiClient::NextEvent(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    auto kept = std::find_if(kept_.begin(), kept_.end(),
                             [](const v1::SidecarMessage& m) { return m.has_event(); });
    if (kept != kept_.end()) {
      v1::RoomEvent event = std::move(*kept->mutable_event());
      kept_.erase(kept);
      return event;
    }
    v1::SidecarMessage message;
    try {
      if (!Receive(deadline - absl::Now(), message)) {
        if (absl::Now() >= deadline) return std::nullopt;
        continue;
      }
    } catch (const zmq::error_t&) {
      return std::nullopt;
    }
    Keep(std::move(message));
  }
}

absl::StatusOr<uint64_t> EngineApiClient::Send(v1::EngineRequest request) {
  const uint64_t id = next_id_++;
  request.set_request_id(id);
  const std::string bytes = request.SerializeAsString();
  try {
    sockets_->dealer.send(zmq::buffer(bytes), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(absl::StrCat("engine API ", endpoint_, ": ", e.what()));
  }
  sent_.insert(id);
  return id;
}

absl::StatusOr<std::optional<v1::SidecarMessage>> EngineApiClient::NextMessage(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (kept_.empty()) {
    v1::SidecarMessage message;
    try {
      if (!Receive(deadline - absl::Now(), message)) {
        if (absl::Now() >= deadline) return std::nullopt;
        continue;
      }
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(absl::StrCat("engine API ", endpoint_, ": ", e.what()));
    }
    Keep(std::move(message));
  }
  v1::SidecarMessage message = std::move(kept_.front());
  kept_.pop_front();
  if (message.has_reply()) sent_.erase(message.reply().request_id());
  return message;
}

}  // namespace kvrail::engine_api
