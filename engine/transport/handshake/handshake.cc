#include "engine/transport/handshake/handshake.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

namespace kvrail::transport {
namespace {

constexpr absl::string_view kOk = "ok";
constexpr absl::string_view kError = "error";
constexpr size_t kMaxSessionIdBytes = 512;  // CACHEPD §3.2, frame 3

// One ZeroMQ context for the process, never destroyed: a context's destructor waits for every
// socket in it, and a static one would be torn down at exit while other statics still hold
// sockets.
zmq::context_t& Context() {
  static zmq::context_t* context = new zmq::context_t(1);
  return *context;
}

bool HostCharOk(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

// `bytes` for a message: printable ASCII as is, other bytes as \xNN, at most `limit` bytes.
std::string Printable(absl::string_view bytes, size_t limit = 64) {
  std::string out;
  for (char c : bytes.substr(0, limit)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) ? std::string(1, c) : absl::StrFormat("\\x%02x", u);
  }
  if (bytes.size() > limit) out += "...";
  return out;
}

absl::string_view View(const zmq::message_t& message) {
  return absl::string_view(static_cast<const char*>(message.data()), message.size());
}

}  // namespace

absl::StatusOr<SessionAddress> ParseSessionId(absl::string_view session_id) {
  const std::string quoted = absl::StrCat("session id \"", Printable(session_id), "\"");
  if (session_id.empty() || session_id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, ": must be 1 to 512 characters (CACHEPD §3.2, frame 3)"));
  }
  const size_t colon = session_id.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(quoted, ": must be <host>:<port>"));
  }
  absl::string_view host = session_id.substr(0, colon);
  const absl::string_view port_text = session_id.substr(colon + 1);
  SessionAddress address;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    const absl::string_view inner = host.substr(1, host.size() - 2);
    for (char c : inner) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return absl::InvalidArgumentError(
            absl::StrCat(quoted, ": a bracketed IPv6 host holds only hex digits, ':' and '.'"));
      }
    }
    if (inner.empty()) return absl::InvalidArgumentError(absl::StrCat(quoted, ": empty host"));
  } else {
    if (host.empty()) return absl::InvalidArgumentError(absl::StrCat(quoted, ": empty host"));
    for (char c : host) {
      if (!HostCharOk(c)) {
        return absl::InvalidArgumentError(absl::StrCat(
            quoted, ": the host holds only letters, digits, '.', '-' and '_' (IPv6 in [])"));
      }
    }
  }
  address.host = std::string(host);
  int port = 0;
  const bool canonical = !port_text.empty() && port_text.size() <= 5 &&
                         (port_text.size() == 1 || port_text[0] != '0') &&
                         absl::c_all_of(port_text, [](char c) { return c >= '0' && c <= '9'; });
  if (!canonical || !absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, ": the port must be a canonical decimal in [1, 65535]"));
  }
  address.port = port;
  return address;
}

struct HandshakeServer::Sockets {
  // With CURVE on: a context of its own and its ZAP handler, declared before the router so
  // that the router closes, then the handler stops, before the context terminates.
  std::unique_ptr<zmq::context_t> context;
  std::unique_ptr<zmq_auth::ZapHandler> zap;
  zmq::socket_t router;
};

absl::StatusOr<std::unique_ptr<HandshakeServer>> HandshakeServer::Start(
    std::string bind_host, int port, Source source, std::string advertise_host,
    std::optional<zmq_auth::CurveServerKeys> curve) {
  if (!source)
    return absl::InvalidArgumentError("handshake server: the descriptor source is empty");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("handshake server: port %d is outside [0, 65535]", port));
  }
  if (advertise_host.empty()) {
    if (bind_host == "0.0.0.0" || bind_host == "*" || bind_host.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "handshake server: binding \"", bind_host,
          "\" needs an advertise host, the address peers reach (it becomes the session id)"));
    }
    advertise_host = bind_host;
  }
  std::unique_ptr<HandshakeServer> server(new HandshakeServer);
  server->source_ = std::move(source);
  server->sockets_ = std::make_unique<Sockets>();
  const std::string endpoint = absl::StrFormat("tcp://%s:%d", bind_host, port);
  zmq::context_t* context = &Context();
  if (curve) {
    server->sockets_->context = std::make_unique<zmq::context_t>(1);
    context = server->sockets_->context.get();
    KVRAIL_ASSIGN_OR_RETURN(server->sockets_->zap,
                            zmq_auth::ZapHandler::Start(context->handle(), std::move(curve->zap)));
  }
  try {
    zmq::socket_t router(*context, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    if (curve) KVRAIL_RETURN_IF_ERROR(zmq_auth::MakeCurveServer(router.handle(), curve->own));
    router.set(zmq::sockopt::maxmsgsize, kMaxHandshakeRequestBytes);
    router.set(zmq::sockopt::router_mandatory, 0);
    router.bind(endpoint);
    const std::string bound = router.get(zmq::sockopt::last_endpoint);
    const size_t colon = bound.rfind(':');
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(bound).substr(colon + 1), &server->port_)) {
      return absl::InternalError(
          absl::StrCat("handshake server: cannot read the bound port of ", bound));
    }
    server->sockets_->router = std::move(router);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("handshake server: bind ", endpoint, " failed: ", e.what()));
  }
  server->session_id_ = absl::StrFormat("%s:%d", advertise_host, server->port_);
  KVRAIL_RETURN_IF_ERROR(ParseSessionId(server->session_id_).status());
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

HandshakeServer::~HandshakeServer() { Stop(); }

void HandshakeServer::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (sockets_ != nullptr) {
    sockets_->router.close();
    sockets_->zap.reset();
  }
}

void HandshakeServer::Run() {
  zmq::socket_t& router = sockets_->router;
  while (!stop_.load()) {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      std::vector<zmq::message_t> request;
      if (!zmq::recv_multipart(router, std::back_inserter(request), zmq::recv_flags::dontwait)) {
        continue;
      }
      if (request.empty()) continue;
      std::vector<zmq::message_t> reply;
      reply.emplace_back(request[0].data(), request[0].size());  // the client's identity
      reply.emplace_back(kHandshakeMagic.data(), kHandshakeMagic.size());
      auto answer = [&](absl::string_view kind, const std::string& body) {
        reply.emplace_back(kind.data(), kind.size());
        reply.emplace_back(body.data(), body.size());
      };
      if (request.size() != 3 || View(request[1]) != kHandshakeMagic) {
        answer(kError, absl::StrFormat("handshake request: expected 2 frames [\"%s\", session id], "
                                       "got %d frames",
                                       kHandshakeMagic, request.size() - 1));
      } else if (View(request[2]) != session_id_) {
        answer(kError, absl::StrCat("this endpoint serves session ", session_id_, ", not \"",
                                    Printable(View(request[2])), "\""));
      } else {
        absl::StatusOr<v1::HandshakeDescriptor> descriptor = source_();
        if (!descriptor.ok()) {
          answer(kError, absl::StrCat("session ", session_id_,
                                      ": no descriptor: ", descriptor.status().message()));
        } else {
          descriptor->set_session_id(session_id_);
          answer(kOk, descriptor->SerializeAsString());
        }
      }
      served_.fetch_add(1);  // before the reply: whoever got it may count it at once
      zmq::send_multipart(router, reply, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
      // A peer that vanished between request and reply: nothing to answer.
    }
  }
}

namespace {

// One fetch of FetchDescriptors under way: its socket and what it has got to.
struct Fetch {
  std::string context;   // "handshake with session <id>", for every message
  std::string endpoint;  // tcp://host:port
  std::optional<zmq::socket_t> dealer;
  bool sent = false;
  std::optional<absl::StatusOr<v1::HandshakeDescriptor>> answer;
};

// The answer to a reply of `fetch`'s session.
absl::StatusOr<v1::HandshakeDescriptor> ParseReply(const Fetch& fetch, absl::string_view session_id,
                                                   const std::vector<zmq::message_t>& reply) {
  if (reply.size() != 3 || View(reply[0]) != kHandshakeMagic) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s answered %d frames, not a kvrail handshake reply", fetch.context,
                        fetch.endpoint, reply.size()));
  }
  if (View(reply[1]) == kError) {
    return absl::FailedPreconditionError(
        absl::StrCat(fetch.context, ": the peer refused: ", Printable(View(reply[2]), 1024)));
  }
  v1::HandshakeDescriptor descriptor;
  if (View(reply[1]) != kOk ||
      !descriptor.ParseFromArray(reply[2].data(), static_cast<int>(reply[2].size()))) {
    return absl::DataLossError(
        absl::StrCat(fetch.context, ": the reply does not hold a valid descriptor"));
  }
  if (descriptor.session_id() != session_id) {
    return absl::DataLossError(absl::StrCat(fetch.context, ": the descriptor names session \"",
                                            Printable(descriptor.session_id()), "\""));
  }
  return descriptor;
}

// Connects `fetch`'s DEALER to the session's endpoint; the answer when that fails at once.
void StartFetch(const FetchTarget& target, Fetch& fetch) {
  absl::StatusOr<SessionAddress> address = ParseSessionId(target.session_id);
  if (!address.ok()) {
    fetch.answer = address.status();
    return;
  }
  fetch.context = absl::StrCat("handshake with session ", target.session_id);
  fetch.endpoint = absl::StrFormat("tcp://%s:%d", address->host, address->port);
  try {
    zmq::socket_t& dealer = fetch.dealer.emplace(Context(), zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::maxmsgsize, kMaxDescriptorBytes);
    dealer.set(zmq::sockopt::immediate, 1);
    if (target.curve != nullptr) {
      absl::Status curve = AddContext(zmq_auth::MakeCurveClient(dealer.handle(), target.curve->own,
                                                                target.curve->server_public_key),
                                      fetch.context);
      if (!curve.ok()) {
        fetch.answer = curve;
        return;
      }
    }
    dealer.connect(fetch.endpoint);
  } catch (const zmq::error_t& e) {
    fetch.answer =
        absl::UnavailableError(absl::StrCat(fetch.context, ": ", fetch.endpoint, ": ", e.what()));
  }
}

}  // namespace

std::vector<absl::StatusOr<v1::HandshakeDescriptor>> FetchDescriptors(
    const std::vector<FetchTarget>& targets, absl::Duration timeout) {
  std::vector<Fetch> fetches(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) StartFetch(targets[i], fetches[i]);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Each open fetch waits to send (with `immediate`, a send before the connection is up
    // would block) or for its reply.
    std::vector<zmq::pollitem_t> items;
    std::vector<size_t> which;
    for (size_t i = 0; i < fetches.size(); ++i) {
      Fetch& fetch = fetches[i];
      if (fetch.answer) continue;
      items.push_back({fetch.dealer->handle(), 0,
                       static_cast<short>(fetch.sent ? ZMQ_POLLIN : ZMQ_POLLOUT), 0});
      which.push_back(i);
    }
    const absl::Duration left = deadline - absl::Now();
    if (items.empty() || left <= absl::ZeroDuration()) break;
    try {
      if (zmq::poll(items.data(), items.size(),
                    std::chrono::milliseconds(absl::ToInt64Milliseconds(left) + 1)) == 0) {
        break;
      }
      for (size_t k = 0; k < items.size(); ++k) {
        if (items[k].revents == 0) continue;
        const FetchTarget& target = targets[which[k]];
        Fetch& fetch = fetches[which[k]];
        if (!fetch.sent) {
          const std::vector<zmq::const_buffer> request = {
              zmq::buffer(kHandshakeMagic.data(), kHandshakeMagic.size()),
              zmq::buffer(target.session_id.data(), target.session_id.size())};
          fetch.sent =
              zmq::send_multipart(*fetch.dealer, request, zmq::send_flags::dontwait).has_value();
          continue;
        }
        std::vector<zmq::message_t> reply;
        if (zmq::recv_multipart(*fetch.dealer, std::back_inserter(reply),
                                zmq::recv_flags::dontwait)) {
          fetch.answer = ParseReply(fetch, target.session_id, reply);
        }
      }
    } catch (const zmq::error_t& e) {
      // A failure of the poll itself ends every fetch still open.
      for (Fetch& fetch : fetches) {
        if (!fetch.answer) {
          fetch.answer = absl::UnavailableError(
              absl::StrCat(fetch.context, ": ", fetch.endpoint, ": ", e.what()));
        }
      }
    }
  }
  std::vector<absl::StatusOr<v1::HandshakeDescriptor>> answers;
  answers.reserve(fetches.size());
  for (Fetch& fetch : fetches) {
    if (fetch.answer) {
      answers.push_back(*std::move(fetch.answer));
    } else if (!fetch.sent) {
      answers.push_back(absl::DeadlineExceededError(
          absl::StrFormat("%s: no connection to %s within %s (is the decode sidecar running?)",
                          fetch.context, fetch.endpoint, absl::FormatDuration(timeout))));
    } else {
      answers.push_back(absl::DeadlineExceededError(
          absl::StrFormat("%s: no reply from %s within %s", fetch.context, fetch.endpoint,
                          absl::FormatDuration(timeout))));
    }
  }
  return answers;
}

absl::StatusOr<v1::HandshakeDescriptor> FetchDescriptor(absl::string_view session_id,
                                                        absl::Duration timeout,
                                                        const zmq_auth::CurveClientKeys* curve) {
  return std::move(FetchDescriptors({{std::string(session_id), curve}}, timeout)[0]);
}

DescriptorCache::DescriptorCache(absl::Duration timeout, Fetcher fetcher)
    : fetcher_(std::move(fetcher)) {
  if (!fetcher_) {
    fetcher_ = [timeout](absl::string_view session_id) {
      return FetchDescriptor(session_id, timeout);
    };
  }
}

absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> DescriptorCache::Get(
    const std::string& session_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cached_.find(session_id);
    if (it != cached_.end()) return it->second;
  }
  return Refresh(session_id);
}

absl::StatusOr<std::shared_ptr<const v1::HandshakeDescriptor>> DescriptorCache::Refresh(
    const std::string& session_id, bool* changed) {
  // The fetch runs without the lock: one slow peer must not stall lookups of the others.
  absl::StatusOr<v1::HandshakeDescriptor> fetched = fetcher_(session_id);
  std::lock_guard<std::mutex> lock(mu_);
  ++fetches_;
  if (!fetched.ok()) return fetched.status();
  auto descriptor = std::make_shared<const v1::HandshakeDescriptor>(*std::move(fetched));
  auto& slot = cached_[session_id];
  if (changed != nullptr) {
    *changed = slot == nullptr || slot->version() != descriptor->version();
  }
  slot = descriptor;
  return descriptor;
}

void DescriptorCache::Invalidate(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.erase(session_id);
}

uint64_t DescriptorCache::fetches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fetches_;
}

}  // namespace kvrail::transport
