#include "engine/transport/handshake/handshake.h"

#include <algorithm>
#include <chrono>
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
#include "engine/sync/thread_name.h"
#include "engine/transport/zmq_request/zmq_request.h"

namespace kvrail::transport {
namespace {

constexpr absl::string_view kOk = "ok";
constexpr absl::string_view kError = "error";
constexpr size_t kMaxSessionIdBytes = 512;  // CACHEPD §3.2, frame 3

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
  zmq::context_t* context = &SharedZmqContext();
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
  NameThread(server->thread_, "kvrail-handshk");
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

// The descriptor in a reply to a fetch for `session_id` (`context` and `endpoint` name it).
absl::StatusOr<v1::HandshakeDescriptor> ParseReply(const std::string& context,
                                                   const std::string& endpoint,
                                                   absl::string_view session_id,
                                                   const std::vector<std::string>& reply) {
  if (reply.size() != 3 || reply[0] != kHandshakeMagic) {
    return absl::DataLossError(
        absl::StrFormat("%s: %s answered %d frames, not a kvrail handshake reply", context,
                        endpoint, reply.size()));
  }
  if (reply[1] == kError) {
    return absl::FailedPreconditionError(
        absl::StrCat(context, ": the peer refused: ", Printable(reply[2], 1024)));
  }
  v1::HandshakeDescriptor descriptor;
  if (reply[1] != kOk || !descriptor.ParseFromString(reply[2])) {
    return absl::DataLossError(
        absl::StrCat(context, ": the reply does not hold a valid descriptor"));
  }
  if (descriptor.session_id() != session_id) {
    return absl::DataLossError(absl::StrCat(context, ": the descriptor names session \"",
                                            Printable(descriptor.session_id()), "\""));
  }
  return descriptor;
}

}  // namespace

std::vector<absl::StatusOr<v1::HandshakeDescriptor>> FetchDescriptors(
    const std::vector<FetchTarget>& targets, absl::Duration timeout) {
  std::vector<absl::StatusOr<v1::HandshakeDescriptor>> answers(targets.size(),
                                                               absl::UnknownError("not fetched"));
  std::vector<ZmqRequest> requests;
  std::vector<size_t> which;  // the target of each request
  for (size_t i = 0; i < targets.size(); ++i) {
    absl::StatusOr<SessionAddress> address = ParseSessionId(targets[i].session_id);
    if (!address.ok()) {
      answers[i] = address.status();
      continue;
    }
    requests.push_back({absl::StrFormat("tcp://%s:%d", address->host, address->port),
                        {std::string(kHandshakeMagic), targets[i].session_id},
                        kMaxDescriptorBytes,
                        targets[i].curve});
    which.push_back(i);
  }
  const std::vector<ZmqReply> replies = RequestAll(requests, timeout);
  for (size_t k = 0; k < replies.size(); ++k) {
    const std::string& session_id = targets[which[k]].session_id;
    const std::string& endpoint = requests[k].endpoint;
    const std::string context = absl::StrCat("handshake with session ", session_id);
    absl::StatusOr<v1::HandshakeDescriptor>& answer = answers[which[k]];
    switch (replies[k].outcome) {
      case ZmqReply::Outcome::kReplied:
        answer = ParseReply(context, endpoint, session_id, replies[k].frames);
        break;
      case ZmqReply::Outcome::kNoConnection:
        answer = absl::DeadlineExceededError(
            absl::StrFormat("%s: no connection to %s within %s (is the decode sidecar running?)",
                            context, endpoint, absl::FormatDuration(timeout)));
        break;
      case ZmqReply::Outcome::kNoReply:
        answer = absl::DeadlineExceededError(absl::StrFormat(
            "%s: no reply from %s within %s", context, endpoint, absl::FormatDuration(timeout)));
        break;
      case ZmqReply::Outcome::kFailed:
        answer = AddContext(replies[k].error, context);
        break;
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
