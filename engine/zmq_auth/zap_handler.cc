#include "engine/zmq_auth/zap_handler.h"

#include <zmq.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/sync/thread_name.h"

namespace kvrail::zmq_auth {
namespace {

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr absl::string_view kZapVersion = "1.0";

// Reads one whole multipart message without waiting; false when none is there.
bool ReceiveAll(void* socket, std::vector<std::string>& frames) {
  frames.clear();
  int more = 1;
  while (more) {
    zmq_msg_t part;
    zmq_msg_init(&part);
    if (zmq_msg_recv(&part, socket, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(&part);
      return false;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
    more = zmq_msg_more(&part);
    zmq_msg_close(&part);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZapHandler>> ZapHandler::Start(void* context, ZapOptions options) {
  if (options.allowed == nullptr) {
    return absl::InvalidArgumentError("ZAP handler: no allowed keys");
  }
  std::unique_ptr<ZapHandler> handler(new ZapHandler);
  handler->options_ = std::move(options);
  handler->socket_ = zmq_socket(context, ZMQ_REP);
  if (handler->socket_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("ZAP handler: cannot make a socket: ", zmq_strerror(zmq_errno())));
  }
  const int linger = 0;
  zmq_setsockopt(handler->socket_, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_bind(handler->socket_, kZapEndpoint) != 0) {
    const std::string why = zmq_strerror(zmq_errno());
    zmq_close(handler->socket_);
    handler->socket_ = nullptr;
    return absl::UnavailableError(absl::StrCat("ZAP handler: cannot bind ", kZapEndpoint, ": ", why,
                                               " (one handler per ZeroMQ context)"));
  }
  handler->thread_ = std::thread([h = handler.get()] { h->Run(); });
  NameThread(handler->thread_, "kvrail-zap");
  return handler;
}

ZapHandler::~ZapHandler() { Stop(); }

void ZapHandler::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (socket_ != nullptr) {
    zmq_close(socket_);
    socket_ = nullptr;
  }
}

void ZapHandler::Run() {
  std::vector<std::string> request;
  while (!stop_.load()) {
    zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
    const int ready = zmq_poll(&item, 1, 50);
    if (ready < 0) {
      if (zmq_errno() == ETERM) return;  // the context is closing: nothing left to answer
      continue;
    }
    if (ready == 0 || !ReceiveAll(socket_, request)) continue;
    Answer(request);
  }
}

void ZapHandler::Answer(const std::vector<std::string>& request) {
  // RFC 27: version, request id, domain, address, routing id, mechanism, credentials...
  std::string status = "400";
  std::string text;
  std::string user_id;
  const std::string address = request.size() > 3 ? request[3] : std::string("unknown");
  if (request.size() < 6 || request[0] != kZapVersion) {
    text = "not a ZAP 1.0 request";
  } else if (request[5] != "CURVE") {
    text = absl::StrCat("mechanism ", request[5].substr(0, 16),
                        " refused: only CURVE with an allowed key is accepted");
  } else if (request.size() != 7) {
    text = "a CURVE request carries one credential, the client's public key";
  } else if (const KeyIdentity* identity = options_.allowed->FindBinary(request[6]);
             identity == nullptr) {
    char z85[kZ85KeyChars + 1] = "?";
    if (request[6].size() == 32) {
      zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(request[6].data()), 32);
    }
    text = absl::StrCat("public key ", z85, " is not in the allowed keys");
  } else if (absl::Status admitted = options_.admit ? options_.admit(*identity) : absl::OkStatus();
             !admitted.ok()) {
    text = absl::StrCat(UserId(*identity), " refused: ", admitted.message());
  } else {
    status = "200";
    text = "OK";
    user_id = UserId(*identity);
  }
  // Counted before the answer: whoever sees the connection's first message may read them.
  (status == "200" ? accepted_ : refused_).fetch_add(1);
  const std::string request_id = request.size() > 1 ? request[1] : std::string();
  const std::string frames[] = {std::string(kZapVersion), request_id, status, text, user_id, ""};
  for (size_t i = 0; i < 6; ++i) {
    zmq_send(socket_, frames[i].data(), frames[i].size(), i + 1 < 6 ? ZMQ_SNDMORE : 0);
  }
  if (status != "200" && options_.on_refusal) options_.on_refusal(address, text);
}

}  // namespace kvrail::zmq_auth
