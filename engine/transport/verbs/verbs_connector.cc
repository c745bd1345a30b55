#include "engine/transport/verbs/verbs_connector.h"

#include <chrono>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/transport/zmq_request/zmq_request.h"

namespace kvrail::transport {
namespace {

absl::string_view View(const zmq::message_t& message) {
  return absl::string_view(static_cast<const char*>(message.data()), message.size());
}

zmq::const_buffer Magic() {
  return zmq::buffer(kVerbsConnectMagic, sizeof(kVerbsConnectMagic) - 1);
}

}  // namespace

struct VerbsConnectServer::Sockets {
  zmq::socket_t router;
};

absl::StatusOr<std::unique_ptr<VerbsConnectServer>> VerbsConnectServer::Start(
    const std::string& host, OnConnect on_connect, OnRelease on_release) {
  std::unique_ptr<VerbsConnectServer> server(new VerbsConnectServer());
  server->on_connect_ = std::move(on_connect);
  server->on_release_ = std::move(on_release);
  server->sockets_ = std::make_unique<Sockets>();
  const std::string bind = absl::StrCat("tcp://", host, ":0");
  try {
    zmq::socket_t router(SharedZmqContext(), zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::maxmsgsize, kMaxVerbsConnectBytes);
    router.bind(bind);
    const std::string bound = router.get(zmq::sockopt::last_endpoint);
    server->endpoint_ = absl::StrCat("tcp://", host, bound.substr(bound.rfind(':')));
    server->sockets_->router = std::move(router);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("verbs connect endpoint: bind ", bind, " failed: ", e.what()));
  }
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

VerbsConnectServer::~VerbsConnectServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (sockets_ != nullptr) sockets_->router.close();
}

void VerbsConnectServer::Run() {
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
      v1::VerbsConnectReply reply;
      v1::VerbsConnectMessage message;
      bool answer = true;
      if (request.size() != 3 || View(request[1]) != kVerbsConnectMagic) {
        reply.set_error(absl::StrCat("verbs connect: expected 2 frames [\"", kVerbsConnectMagic,
                                     "\", message], got ", request.size() - 1));
      } else if (!message.ParseFromArray(request[2].data(), static_cast<int>(request[2].size())) ||
                 message.body_case() == v1::VerbsConnectMessage::BODY_NOT_SET) {
        reply.set_error("verbs connect: the message is not a VerbsConnectMessage");
      } else if (message.has_release()) {
        on_release_(message.release());
        answer = false;
      } else {
        reply = on_connect_(message.connect());
      }
      if (!answer) continue;
      const std::string body = reply.SerializeAsString();
      std::vector<zmq::const_buffer> frames = {zmq::buffer(request[0].data(), request[0].size()),
                                               Magic(), zmq::buffer(body.data(), body.size())};
      zmq::send_multipart(router, frames, zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
  }
}

absl::StatusOr<v1::VerbsConnectReply> RequestVerbsConnect(const std::string& endpoint,
                                                          const v1::VerbsConnectRequest& request,
                                                          absl::Duration timeout) {
  const std::string context = absl::StrCat("verbs connect to ", endpoint);
  v1::VerbsConnectMessage message;
  *message.mutable_connect() = request;
  const ZmqReply answer =
      std::move(RequestAll({{endpoint,
                             {std::string(kVerbsConnectMagic), message.SerializeAsString()},
                             kMaxVerbsConnectBytes}},
                           timeout)[0]);
  switch (answer.outcome) {
    case ZmqReply::Outcome::kNoConnection:
      return absl::DeadlineExceededError(
          absl::StrCat(context, ": no connection within ", absl::FormatDuration(timeout)));
    case ZmqReply::Outcome::kNoReply:
      return absl::DeadlineExceededError(
          absl::StrCat(context, ": no reply within ", absl::FormatDuration(timeout)));
    case ZmqReply::Outcome::kFailed:
      return absl::UnavailableError(absl::StrCat(context, ": ", answer.error.message()));
    case ZmqReply::Outcome::kReplied:
      break;
  }
  v1::VerbsConnectReply reply;
  if (answer.frames.size() != 2 || answer.frames[0] != kVerbsConnectMagic ||
      !reply.ParseFromString(answer.frames[1])) {
    return absl::DataLossError(absl::StrCat(context, ": the reply is not a VerbsConnectReply"));
  }
  if (!reply.error().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(context, ": the peer refused: ", reply.error()));
  }
  return reply;
}

void SendVerbsRelease(const std::string& endpoint, const v1::VerbsRelease& release,
                      absl::Duration linger) {
  v1::VerbsConnectMessage message;
  *message.mutable_release() = release;
  const std::string body = message.SerializeAsString();
  try {
    zmq::socket_t dealer(SharedZmqContext(), zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, static_cast<int>(absl::ToInt64Milliseconds(linger)));
    dealer.connect(endpoint);
    const std::vector<zmq::const_buffer> frames = {Magic(), zmq::buffer(body.data(), body.size())};
    zmq::send_multipart(dealer, frames, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
}

}  // namespace kvrail::transport
