// Is the process that answers at a decode session's port the one whose registration the prefill
// verified? A TCP probe (liveness.h) only says somebody listens there: after a decode dies,
// another program, or the decode's own successor, may bind the same port, and a session kept
// alive by a stranger's socket would never be dropped (its registration, data-plane link and
// PUSH route held for ever). The descriptor's session key digest (session_key.h: 32 random
// bytes a decode draws at start) names the process.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/sidecar/prefill_sidecar.h"
#include "engine/base/error.h"
#include "engine/transport/handshake/handshake.h"

namespace kvrail::sidecar {

std::vector<std::string> PrefillSidecar::ConfirmSessions(const std::vector<std::string>& sessions,
                                                         std::vector<Reach>& reach) {
  std::vector<std::string> gone(sessions.size());
  std::vector<size_t> asked;
  // With CURVE a request goes to the key the registration was verified with (and a stranger
  // holding the port never answers it: silent, not gone).
  std::vector<std::optional<zmq_auth::CurveClientKeys>> curve;
  {
    MutexLock lock(&server_keys_mu);
    for (size_t i = 0; i < sessions.size(); ++i) {
      if (reach[i] != Reach::kListening) continue;
      asked.push_back(i);
      auto key = session_server_keys.find(sessions[i]);
      curve.push_back(key == session_server_keys.end()
                          ? std::nullopt
                          : std::optional<zmq_auth::CurveClientKeys>(ClientKeys(key->second)));
    }
  }
  if (asked.empty()) return gone;
  std::vector<transport::FetchTarget> targets;
  targets.reserve(asked.size());
  for (size_t k = 0; k < asked.size(); ++k) {
    targets.push_back({sessions[asked[k]], curve[k] ? &*curve[k] : nullptr});
  }
  const std::vector<absl::StatusOr<v1::HandshakeDescriptor>> answers = transport::FetchDescriptors(
      targets, std::min(options.handshake_timeout, absl::Milliseconds(500)));
  Owned([&] {
    for (size_t k = 0; k < asked.size(); ++k) {
      const size_t i = asked[k];
      const absl::StatusOr<v1::HandshakeDescriptor>& answer = answers[k];
      if (answer.ok()) {
        const std::optional<std::string> digest = gate.KeyDigestOf(sessions[i]);
        if (digest && !digest->empty() && *digest != answer->session_key_digest()) {
          gone[i] = absl::StrCat("Decode session ", sessions[i],
                                 " is gone: its handshake endpoint answers with another session "
                                 "key (another decode process took its port)");
        }
      } else if (answer.status().code() == absl::StatusCode::kFailedPrecondition ||
                 answer.status().code() == absl::StatusCode::kDataLoss) {
        gone[i] = absl::StrCat(
            "Decode session ", sessions[i],
            " is gone: its port answers for somebody else: ", DescribeError(answer.status()));
      } else {
        reach[i] = Reach::kUnknown;  // no answer: stopped, or not kvrail
      }
    }
  });
  return gone;
}

}  // namespace kvrail::sidecar
