#include "control/session/zmq_channel.h"

#include <cerrno>
#include <cmath>
#include <utility>
#include <zmq.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "engine/base/sanitizers.h"
#include "engine/zmq_auth/curve.h"

#if KVRAIL_TSAN
// ThreadSanitizer's interface (sanitizer/tsan_interface.h), declared here: one header fewer.
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kvrail::session {

struct ZmqContext::Impl {
  zmq::context_t context{1};
  // Declared after the context: stopped (its socket closed) before the context terminates.
  std::unique_ptr<zmq_auth::ZapHandler> zap;
};

struct ZmqInbox::Socket {
  zmq::socket_t socket;
};

struct ZmqOutbox::Peer {
  std::mutex mu;         // serialises sends: one multipart message at a time
  zmq::socket_t socket;  // guarded by mu
  absl::Time last_used;  // guarded by the outbox's mu_: when a Send last took this socket
};

namespace {

// A message is a hand-over between threads: what the sender wrote before sending happens before
// what the receiver reads after receiving. libzmq (not built with TSan) makes it one with
// atomics TSan cannot see, so a sidecar's writes that another sidecar in the same process reads
// once a message said so (a decode scattering rows a prefill wrote through the loopback
// backend, then offering the slot again) look like races. Every send releases, and every
// receive acquires, this one address under TSan; other builds do nothing.
[[maybe_unused]] char message_handover;

void Released() {
#if KVRAIL_TSAN
  __tsan_release(&message_handover);
#endif
}

void Acquired() {
#if KVRAIL_TSAN
  __tsan_acquire(&message_handover);
#endif
}

// Milliseconds for a ZeroMQ timeout: -1 for ever, rounded up otherwise.
int TimeoutMillis(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return -1;
  if (timeout <= absl::ZeroDuration()) return 0;
  const double ms = std::ceil(absl::ToDoubleMilliseconds(timeout));
  return ms > 2147483647.0 ? 2147483647 : static_cast<int>(ms);
}

absl::Status FromZmqError(const zmq::error_t& error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", error.what());
  switch (error.num()) {
    case ETERM:
      return absl::UnavailableError(absl::StrCat(message, " (the ZeroMQ context is closing)"));
    case EINVAL:
    case EPROTONOSUPPORT:
    case ENOCOMPATPROTO:
      return absl::InvalidArgumentError(message);
    case EADDRINUSE:
    case EADDRNOTAVAIL:
    case ENODEV:
    case EAGAIN:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

// "tcp://host:port" with a non-empty host and a port in 1..65535.
bool IsTcpEndpoint(absl::string_view endpoint) {
  if (!absl::ConsumePrefix(&endpoint, "tcp://")) return false;
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  uint32_t port = 0;
  return absl::SimpleAtoi(endpoint.substr(colon + 1), &port) && port >= 1 && port <= 65535;
}

}  // namespace

// --- context ------------------------------------------------------------------------------

ZmqContext::ZmqContext() : impl_(std::make_unique<Impl>()) {}
ZmqContext::~ZmqContext() = default;

std::shared_ptr<ZmqContext> ZmqContext::Create() {
  return std::shared_ptr<ZmqContext>(new ZmqContext());
}

absl::StatusOr<std::shared_ptr<ZmqContext>> ZmqContext::CreateWithZap(zmq_auth::ZapOptions zap) {
  std::shared_ptr<ZmqContext> context(new ZmqContext());
  absl::StatusOr<std::unique_ptr<zmq_auth::ZapHandler>> handler =
      zmq_auth::ZapHandler::Start(context->impl().context.handle(), std::move(zap));
  if (!handler.ok()) return handler.status();
  context->impl().zap = *std::move(handler);
  return context;
}

// --- inbox --------------------------------------------------------------------------------

ZmqInbox::ZmqInbox(std::shared_ptr<ZmqContext> context, InboxOptions options)
    : context_(std::move(context)), options_(options) {}

ZmqInbox::~ZmqInbox() { Close(); }

absl::StatusOr<std::unique_ptr<ZmqInbox>> ZmqInbox::Bind(std::shared_ptr<ZmqContext> context,
                                                         absl::string_view host, int port,
                                                         InboxOptions options) {
  if (host.empty() || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("inbox address \"", host, "\":", port, " needs a host and a port 0..65535"));
  }
  const std::string address =
      absl::StrCat("tcp://", host, ":", port == 0 ? std::string("*") : absl::StrCat(port));
  std::unique_ptr<ZmqInbox> inbox(new ZmqInbox(std::move(context), options));
  try {
    auto socket = std::make_unique<Socket>(
        Socket{zmq::socket_t(inbox->context_->impl().context, zmq::socket_type::pull)});
    socket->socket.set(zmq::sockopt::linger, 0);
    socket->socket.set(zmq::sockopt::rcvhwm, options.receive_hwm);
    socket->socket.set(zmq::sockopt::maxmsgsize, options.max_frame_bytes);
    if (options.curve_server != nullptr) {
      if (inbox->context_->impl().zap == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "inbox ", address, ": CURVE needs a ZAP handler on its context (CreateWithZap)"));
      }
      if (absl::Status curve =
              zmq_auth::MakeCurveServer(socket->socket.handle(), *options.curve_server);
          !curve.ok()) {
        return curve;
      }
    }
    socket->socket.bind(address);
    inbox->endpoint_ = socket->socket.get(zmq::sockopt::last_endpoint);
    inbox->poll_handle_ = socket->socket.handle();
    inbox->socket_ = std::move(socket);
  } catch (const zmq::error_t& error) {
    return FromZmqError(error, absl::StrCat("cannot bind the inbox to ", address));
  }
  const size_t colon = inbox->endpoint_.rfind(':');
  uint32_t bound_port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(inbox->endpoint_).substr(colon + 1), &bound_port)) {
    return absl::InternalError(
        absl::StrCat("inbox bound to an unreadable endpoint \"", inbox->endpoint_, "\""));
  }
  inbox->port_ = static_cast<uint16_t>(bound_port);
  if (options.on_connection_cut) {
    absl::StatusOr<std::unique_ptr<InboxWatch>> watch =
        InboxWatch::Start(inbox->context_->impl().context.handle(), inbox->socket_->socket.handle(),
                          inbox->port_, options.max_frame_bytes, options.on_connection_cut);
    if (!watch.ok()) return watch.status();
    inbox->watch_ = *std::move(watch);
  }
  return inbox;
}

absl::StatusOr<std::optional<std::vector<std::string>>> ZmqInbox::Receive(absl::Duration timeout,
                                                                          std::string* user_id,
                                                                          std::string* peer_host) {
  if (user_id != nullptr) user_id->clear();
  if (peer_host != nullptr) peer_host->clear();
  std::lock_guard<std::mutex> lock(mu_);
  if (socket_ == nullptr) return absl::FailedPreconditionError("the inbox is closed");
  zmq::socket_t& socket = socket_->socket;
  try {
    std::vector<std::string> frames;
    size_t count = 0;
    bool more = true;
    while (more) {
      zmq::message_t part;
      // The first part is there (POLLIN) and the rest of a multipart message arrives with it.
      if (!socket.recv(part, zmq::recv_flags::dontwait)) {
        if (count > 0) return absl::InternalError("a multipart message ended early");
        // A zero timeout asks for what is queued: no poll (a reader that polled already reads
        // until nothing is left, one call fewer per wake).
        if (timeout <= absl::ZeroDuration()) return std::optional<std::vector<std::string>>();
        // Nothing queued: wait. What has arrived already needs no poll (a busy inbox reads
        // many messages per wakeup, each a poll(2) call fewer).
        zmq_pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, TimeoutMillis(timeout)) < 0) {
          if (zmq_errno() == EINTR) return std::optional<std::vector<std::string>>();
          throw zmq::error_t();
        }
        if ((item.revents & ZMQ_POLLIN) == 0) return std::optional<std::vector<std::string>>();
        if (!socket.recv(part, zmq::recv_flags::dontwait)) {
          return std::optional<std::vector<std::string>>();
        }
      }
      more = part.more();
      if (count == 0 && user_id != nullptr) {
        // Every part of a message came on one connection: the first one's User-Id is its.
        *user_id = zmq_auth::UserIdOf(part.handle()).value_or("");
      }
      if (count == 0 && peer_host != nullptr) {
        const char* address = zmq_msg_gets(part.handle(), "Peer-Address");
        if (address != nullptr) *peer_host = address;
      }
      ++count;
      if (count <= options_.max_frames) frames.push_back(part.to_string());
    }
    if (count > options_.max_frames) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message of ", count, " frames dropped: more than ", options_.max_frames, " frames"));
    }
    Acquired();
    return std::optional<std::vector<std::string>>(std::move(frames));
  } catch (const zmq::error_t& error) {
    return FromZmqError(error, absl::StrCat("receive on ", endpoint_));
  }
}

void ZmqInbox::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  watch_.reset();  // first: the socket's own close is no peer's cut
  socket_.reset();
}

// --- outbox -------------------------------------------------------------------------------

ZmqOutbox::ZmqOutbox(std::shared_ptr<ZmqContext> context, OutboxOptions options)
    : context_(std::move(context)), options_(options) {}

ZmqOutbox::~ZmqOutbox() = default;

std::shared_ptr<ZmqOutbox::Peer> ZmqOutbox::PeerFor(const std::string& endpoint,
                                                    absl::Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = peers_.find(endpoint);
  if (found != peers_.end()) {
    found->second->last_used = absl::Now();
    return found->second;
  }
  std::string server_key;
  if (options_.curve_client != nullptr) {
    auto key = server_keys_.find(endpoint);
    if (key == server_keys_.end()) {
      error = absl::FailedPreconditionError(absl::StrCat(
          "peer ", endpoint, ": CURVE is on and no server public key is known for it"));
      return nullptr;
    }
    server_key = key->second;
  }
  try {
    auto peer = std::make_shared<Peer>();
    peer->socket = zmq::socket_t(context_->impl().context, zmq::socket_type::push);
    if (options_.curve_client != nullptr) {
      error = zmq_auth::MakeCurveClient(peer->socket.handle(), *options_.curve_client, server_key);
      if (!error.ok()) return nullptr;
    }
    peer->socket.set(zmq::sockopt::linger, 0);
    peer->socket.set(zmq::sockopt::sndhwm, options_.send_hwm);
    peer->socket.set(zmq::sockopt::immediate, options_.immediate);
    peer->socket.set(zmq::sockopt::reconnect_ivl,
                     std::max(1, TimeoutMillis(options_.reconnect_interval)));
    if (options_.send_timeout > absl::ZeroDuration()) {
      peer->socket.set(zmq::sockopt::sndtimeo, TimeoutMillis(options_.send_timeout));
    }
    peer->socket.connect(endpoint);  // asynchronous: never waits for the peer
    peer->last_used = absl::Now();
    peers_.emplace(endpoint, peer);
    return peer;
  } catch (const zmq::error_t& e) {
    error = FromZmqError(e, absl::StrCat("cannot connect to ", endpoint));
    return nullptr;
  }
}

absl::Status ZmqOutbox::Send(absl::string_view endpoint_view,
                             absl::Span<const std::string> frames) {
  const std::string endpoint(endpoint_view.data(), endpoint_view.size());
  if (frames.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no frames to send to ", endpoint));
  }
  if (!IsTcpEndpoint(endpoint)) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer endpoint \"", endpoint, "\" is not tcp://host:port"));
  }
  std::vector<std::string> intercepted;
  if (options_.intercept) {
    intercepted.assign(frames.begin(), frames.end());
    if (!options_.intercept(intercepted)) return absl::OkStatus();
    if (intercepted.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the test's intercept left no frames to send to ", endpoint));
    }
    frames = intercepted;
  }
  absl::Status error;
  std::shared_ptr<Peer> peer = PeerFor(endpoint, error);
  if (peer == nullptr) return error;

  const zmq::send_flags wait = options_.send_timeout > absl::ZeroDuration()
                                   ? zmq::send_flags::none
                                   : zmq::send_flags::dontwait;
  std::lock_guard<std::mutex> lock(peer->mu);
  size_t sent = 0;
  Released();
  try {
    for (; sent < frames.size(); ++sent) {
      const bool last = sent + 1 == frames.size();
      const zmq::send_flags flags = last ? wait : (wait | zmq::send_flags::sndmore);
      if (!peer->socket.send(zmq::buffer(frames[sent]), flags)) {
        // EAGAIN. ZeroMQ checks the high-water mark on a message's first frame only, so this
        // happens before anything of the message is queued.
        break;
      }
    }
  } catch (const zmq::error_t& e) {
    error = FromZmqError(e, absl::StrCat("send to ", endpoint));
  }
  if (sent == frames.size()) return absl::OkStatus();
  if (sent > 0) {
    // Part of a message is queued and cannot be withdrawn: drop the socket with it, so the
    // peer never sees a truncated message glued to the next one.
    std::lock_guard<std::mutex> map_lock(mu_);
    auto found = peers_.find(endpoint);
    if (found != peers_.end() && found->second == peer) peers_.erase(found);
  }
  if (!error.ok()) return error;
  return absl::UnavailableError(
      absl::StrCat("peer ", endpoint, " is unreachable or its queue is full (send high-water mark ",
                   options_.send_hwm, options_.immediate ? ", immediate" : "", "): message of ",
                   frames.size(), " frames not sent"));
}

void ZmqOutbox::SetServerKey(const std::string& endpoint, const std::string& public_key) {
  if (options_.curve_client == nullptr) return;
  std::shared_ptr<Peer> dropped;  // closed once the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto [key, inserted] = server_keys_.try_emplace(endpoint, public_key);
  if (inserted || key->second == public_key) return;
  key->second = public_key;
  auto found = peers_.find(endpoint);
  if (found == peers_.end()) return;
  dropped = std::move(found->second);
  peers_.erase(found);
}

void ZmqOutbox::Forget(absl::string_view endpoint) {
  std::shared_ptr<Peer> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Its server key goes too (it would otherwise stay for every endpoint ever keyed): a later
    // Send there needs SetServerKey again.
    server_keys_.erase(std::string(endpoint.data(), endpoint.size()));
    auto found = peers_.find(std::string(endpoint.data(), endpoint.size()));
    if (found == peers_.end()) return;
    dropped = std::move(found->second);
    peers_.erase(found);
  }
  // Closed here, or by a Send still using it, whichever lets go last.
}

std::vector<std::string> ZmqOutbox::UnusedSince(absl::Time since) const {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [endpoint, peer] : peers_) {
    if (peer->last_used < since) out.push_back(endpoint);
  }
  return out;
}

size_t ZmqOutbox::peer_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.size();
}

}  // namespace kvrail::session
