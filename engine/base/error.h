// Error categories shared by every layer (docs/ARCHITECTURE.md, layer 0): the CachePD codecs,
// the planner, the data plane and the tools.
//
// Every rejection in kvrail is an absl::Status whose message names the input (frame, key or
// field) and the rule it broke, in one line. The status also carries one of the categories
// below, which `kvrail inspect` prints as `error: <category>: <message>` and which the session
// layer uses to decide how to answer a peer.
#ifndef KVRAIL_ENGINE_BASE_ERROR_H_
#define KVRAIL_ENGINE_BASE_ERROR_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvrail {

enum class ErrorCategory {
  kInvalidFrame,       // a ZMQ frame breaks CACHEPD §3
  kInvalidContract,    // a contract breaks CACHEPD §4.3 / §4.4 (or kvrail's strict rules)
  kIncompatiblePeer,   // a prefill/decode contract pair breaks CACHEPD §4.5
  kInvalidManifest,    // a manifest breaks CACHEPD §5
  kUnsupportedLayout,  // the planner cannot map the pair (CACHEPD §6.1, §6.7, §8)
};

// The stable name printed by tools: "invalid-frame", "invalid-contract", ...
absl::string_view CategoryName(ErrorCategory category);

// Parses a name produced by CategoryName. Returns nullopt for anything else.
std::optional<ErrorCategory> CategoryFromName(absl::string_view name);

// Returns an InvalidArgument status with `message` that carries `category`. The message is
// kept on one line: a control character in it (a newline in a peer's id, say) is written as
// \xNN.
absl::Status MakeError(ErrorCategory category, absl::string_view message);

// The category carried by `status`, or nullopt for OK and for statuses made elsewhere.
std::optional<ErrorCategory> CategoryOf(const absl::Status& status);

// Returns `status` with "<context>: " put in front of its message, on one line as MakeError
// keeps it; code and category are kept. OK stays OK.
absl::Status AddContext(const absl::Status& status, absl::string_view context);

// One line as tools print it: "<category>: <message>" ("error" when there is no category).
std::string DescribeError(const absl::Status& status);

}  // namespace kvrail

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define KVRAIL_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status kvrail_status_ = (expr);          \
    if (!kvrail_status_.ok()) return kvrail_status_; \
  } while (false)

#define KVRAIL_CONCAT_INNER_(a, b) a##b
#define KVRAIL_CONCAT_(a, b) KVRAIL_CONCAT_INNER_(a, b)

// `lhs = value of expr` for an absl::StatusOr expression, or returns its error.
#define KVRAIL_ASSIGN_OR_RETURN(lhs, expr) \
  KVRAIL_ASSIGN_OR_RETURN_IMPL_(KVRAIL_CONCAT_(kvrail_statusor_, __LINE__), lhs, expr)
// `lhs` may be a declaration, so it cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KVRAIL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // KVRAIL_ENGINE_BASE_ERROR_H_
