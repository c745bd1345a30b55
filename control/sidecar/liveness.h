// Is anybody listening at a peer's TCP port? A kvrail sidecar asks this of the sockets its peers
// bound (a decode's handshake endpoint, a prefill's CachePD PULL socket) to tell a peer that is
// gone from one that is slow: a refused connection means no process listens there any more (a
// crashed or restarted sidecar), while a stopped or cut-off one still accepts, or times out.
// CACHEPD's own liveness is the bootstrap's /health (§1.6), which a dead sidecar behind a live
// bootstrap server never fails.
#ifndef KVRAIL_CONTROL_SIDECAR_LIVENESS_H_
#define KVRAIL_CONTROL_SIDECAR_LIVENESS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kvrail::sidecar {

enum class Reach {
  kListening,  // the connection was accepted
  kRefused,    // nobody listens there: the peer's process is gone
  kUnknown,    // no answer within the timeout, or the address does not resolve
};

// Connects to tcp://host:port and closes at once, waiting at most `timeout`.
Reach ProbeTcp(const std::string& host, int port, absl::Duration timeout);

// The same for "tcp://host:port" or "host:port"; kUnknown when it does not parse.
Reach ProbeEndpoint(const std::string& endpoint, absl::Duration timeout);

// Probes every endpoint at once, in at most `timeout` together, so that a hundred silent peers
// cost one timeout, not a hundred. The answers are in the order of `endpoints`.
std::vector<Reach> ProbeEndpoints(const std::vector<std::string>& endpoints,
                                  absl::Duration timeout);

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_LIVENESS_H_
