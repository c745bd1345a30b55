#include "engine/transport/zmq_request/zmq_request.h"

#include <chrono>
#include <iterator>
#include <optional>
#include <utility>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvrail::transport {

zmq::context_t& SharedZmqContext() {
  static zmq::context_t* context = new zmq::context_t(1);
  return *context;
}

namespace {

// One request under way.
struct Pending {
  std::optional<zmq::socket_t> dealer;
  bool sent = false;
  bool done = false;
};

// Opens `pending`'s DEALER to the request's endpoint; fills `reply` when that fails.
void Open(const ZmqRequest& request, Pending& pending, ZmqReply& reply) {
  try {
    zmq::socket_t& dealer = pending.dealer.emplace(SharedZmqContext(), zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::maxmsgsize, request.max_reply_bytes);
    dealer.set(zmq::sockopt::immediate, 1);
    if (request.curve != nullptr) {
      absl::Status curve = zmq_auth::MakeCurveClient(dealer.handle(), request.curve->own,
                                                     request.curve->server_public_key);
      if (!curve.ok()) {
        reply = {ZmqReply::Outcome::kFailed, {}, curve};
        pending.done = true;
        return;
      }
    }
    dealer.connect(request.endpoint);
  } catch (const zmq::error_t& e) {
    reply = {ZmqReply::Outcome::kFailed,
             {},
             absl::UnavailableError(absl::StrCat(request.endpoint, ": ", e.what()))};
    pending.done = true;
  }
}

// Sends the request (its connection is up) or takes the answer (one came).
void Step(const ZmqRequest& request, Pending& pending, ZmqReply& reply) {
  if (!pending.sent) {
    std::vector<zmq::const_buffer> frames;
    for (const std::string& frame : request.frames) {
      frames.push_back(zmq::buffer(frame.data(), frame.size()));
    }
    pending.sent =
        zmq::send_multipart(*pending.dealer, frames, zmq::send_flags::dontwait).has_value();
    if (pending.sent) reply.outcome = ZmqReply::Outcome::kNoReply;
    return;
  }
  std::vector<zmq::message_t> answer;
  if (!zmq::recv_multipart(*pending.dealer, std::back_inserter(answer),
                           zmq::recv_flags::dontwait)) {
    return;
  }
  reply.outcome = ZmqReply::Outcome::kReplied;
  for (const zmq::message_t& frame : answer) reply.frames.push_back(frame.to_string());
  pending.done = true;
}

}  // namespace

std::vector<ZmqReply> RequestAll(const std::vector<ZmqRequest>& requests, absl::Duration timeout) {
  std::vector<ZmqReply> replies(requests.size());
  std::vector<Pending> pending(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) Open(requests[i], pending[i], replies[i]);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Each open request waits to be sent (with `immediate`, a send before the connection is up
    // would block) or for its answer.
    std::vector<zmq::pollitem_t> items;
    std::vector<size_t> which;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i].done) continue;
      items.push_back({pending[i].dealer->handle(), 0,
                       static_cast<short>(pending[i].sent ? ZMQ_POLLIN : ZMQ_POLLOUT), 0});
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
        if (items[k].revents != 0) Step(requests[which[k]], pending[which[k]], replies[which[k]]);
      }
    } catch (const zmq::error_t& e) {
      // The poll itself failed: every request still open ends with it.
      for (size_t i = 0; i < pending.size(); ++i) {
        if (pending[i].done) continue;
        replies[i] = {ZmqReply::Outcome::kFailed,
                      {},
                      absl::UnavailableError(absl::StrCat(requests[i].endpoint, ": ", e.what()))};
        pending[i].done = true;
      }
    }
  }
  return replies;
}

}  // namespace kvrail::transport
