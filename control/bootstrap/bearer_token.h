// The bootstrap server's bearer token: an opt-in shared secret that PUT /route must carry
// (docs/SECURITY.md). Not CachePD's "bootstrap token" (the first output token a prefill samples,
// CACHEPD §1.3), which is a room's and travels in status frames; this one is a deployment's,
// sent as "Authorization: Bearer <token>" (RFC 6750 §2.1). That is the header SGLang's proposed fix
// for the same hole uses (sgl-project/sglang#39400, #39416), so one token file can serve a
// mixed deployment. GET /route and /health never need it: decode ranks and heartbeats read the
// node without one (CACHEPD §1.6, §2.2).
#ifndef KVRAIL_CONTROL_BOOTSTRAP_BEARER_TOKEN_H_
#define KVRAIL_CONTROL_BOOTSTRAP_BEARER_TOKEN_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::bootstrap {

inline constexpr char kAuthorizationHeader[] = "Authorization";

// The longest token accepted; anything longer is a mistake (a wrong file), not a secret.
inline constexpr size_t kMaxBearerTokenBytes = 4096;

// OK when `token` can be one: 1..kMaxBearerTokenBytes bytes of RFC 6750's b64token (letters,
// digits,
// "-._~+/", then "=" padding), which every HTTP stack carries unchanged (no "%", which some
// decode). Otherwise InvalidArgument naming the rule, never the token.
absl::Status ValidateBearerToken(absl::string_view token);

// The token in the file at `path`: its content without leading and trailing whitespace (so a
// trailing newline is fine), which ValidateBearerToken must accept. Errors name the path and the
// rule.
absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path);

// "Bearer <token>": the Authorization header's value a client sends.
std::string BearerAuthorization(absl::string_view token);

// True when `authorization` (the header's value) is "Bearer <token>", the scheme matched
// without regard to case (RFC 9110 §11.1). The token is compared in time that depends on the
// lengths alone, never on where the two first differ, so answers do not leak it byte by byte.
bool AuthorizationCarries(absl::string_view authorization, absl::string_view token);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_BEARER_TOKEN_H_
