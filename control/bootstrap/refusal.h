// Why the bootstrap server refuses a request, and so which HTTP status answers it.
//
// CACHEPD §2 says a handler exception becomes aiohttp's 500, and §2.1/§2.2 list where the
// reference raises: a malformed body, a missing member, an integer text Python's int() cannot
// read, a layout that is not an ASCII string holding a contract, incompatible layouts, an
// unknown rank. kvrail answers exactly those with 500 too, so a peer sees the same status from
// either server. Where the reference accepts a request only because it never checks it (a rank
// outside the world, sizes that do not divide, a second registration that disagrees with the
// first), kvrail refuses it with a 4xx instead; likewise what only kvrail checks at all (the
// bootstrap token, a registered rank's endpoint, the configured node: docs/SECURITY.md).
// Every refusal's body is one line naming the member and the rule.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_REFUSAL_H_
#define KVRAIL_CONTROL_BOOTSTRAP_REFUSAL_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvrail::bootstrap {

enum class Refusal {
  kReferenceRaises,  // 500: the reference's handler raises on this input (CACHEPD §2)
  kBadRequest,       // 400: well-formed, but breaks a rule the reference does not check
  kConflict,         // 409: disagrees with what the node registered first, or was configured
  kUnauthorized,     // 401: lacks the bootstrap token the server was started with (bearer_token.h)
};

// An error status carrying `refusal`: InvalidArgument for the first two, FailedPrecondition
// for a conflict, Unauthenticated for a missing or wrong token. Its message is `message` with
// control characters written as \xNN, so it is one line whatever input it quotes.
absl::Status Refuse(Refusal refusal, absl::string_view message);

// The HTTP status that answers `status`: 200 for OK, the refusal's status when it carries one,
// else 500 (an unexpected error is a handler exception, as in the reference).
int HttpStatusOf(const absl::Status& status);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_REFUSAL_H_
