// Request and reply over ZeroMQ, for the data plane's small side channels (the handshake's
// descriptor fetch, the verbs backend's connect): a DEALER per request, with `immediate` so that
// nothing is queued for a peer that is not there, every request of a call waited on together,
// one deadline for all of them.
#ifndef KVRAIL_ENGINE_TRANSPORT_ZMQ_REQUEST_ZMQ_REQUEST_H_
#define KVRAIL_ENGINE_TRANSPORT_ZMQ_REQUEST_ZMQ_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/zmq_auth/curve.h"

namespace zmq {
class context_t;
}

namespace kvrail::transport {

// The process's ZeroMQ context for these channels, never destroyed: a context's destructor
// waits for every socket in it, and a static one would be torn down at exit while other
// statics still hold sockets.
zmq::context_t& SharedZmqContext();

struct ZmqRequest {
  std::string endpoint;             // "tcp://host:port"
  std::vector<std::string> frames;  // sent as one multipart message
  int64_t max_reply_bytes = int64_t{1} << 20;
  // With CURVE: the keys the request goes with (borrowed for the call); only the server
  // holding `server_public_key`'s secret answers.
  const zmq_auth::CurveClientKeys* curve = nullptr;
};

struct ZmqReply {
  enum class Outcome {
    kReplied,       // `frames` holds the answer
    kNoConnection,  // no connection came up before the deadline
    kNoReply,       // sent, and no answer before the deadline
    kFailed,        // `error` says what (a bad endpoint, a CURVE key, a ZeroMQ error)
  };
  Outcome outcome = Outcome::kNoConnection;
  std::vector<std::string> frames;
  absl::Status error;
};

// Sends every request and waits for their answers, all at once, for at most `timeout` together.
// The replies are in the order of `requests`.
std::vector<ZmqReply> RequestAll(const std::vector<ZmqRequest>& requests, absl::Duration timeout);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_ZMQ_REQUEST_ZMQ_REQUEST_H_
