#include "control/session/failure_cause.h"

namespace kvrail::session {

absl::string_view FailureCauseLabel(FailureCause cause) {
  switch (cause) {
    case FailureCause::kNone:
      return "";
    case FailureCause::kAborted:
      return "aborted";
    case FailureCause::kTimeout:
      return "timeout";
    case FailureCause::kPeerFailed:
      return "peer_failed";
    case FailureCause::kExpired:
      return "expired";
    case FailureCause::kHandshake:
      return "handshake";
    case FailureCause::kTransport:
      return "transport";
    case FailureCause::kBounds:
      return "bounds";
    case FailureCause::kInvalid:
      return "invalid";
    case FailureCause::kRefused:
      return "refused";
    case FailureCause::kDigest:
      return "digest";
    case FailureCause::kEngine:
      return "engine";
    case FailureCause::kBootstrap:
      return "bootstrap";
    case FailureCause::kOther:
      break;
  }
  return "other";
}

FailureCause FailureCauseFromLabel(absl::string_view label) {
  for (int i = static_cast<int>(FailureCause::kNone); i <= static_cast<int>(FailureCause::kOther);
       ++i) {
    const auto cause = static_cast<FailureCause>(i);
    if (FailureCauseLabel(cause) == label) return cause;
  }
  return FailureCause::kOther;
}

FailureCause FailureCauseOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return FailureCause::kNone;
    case absl::StatusCode::kDeadlineExceeded:
      return FailureCause::kTimeout;
    case absl::StatusCode::kOutOfRange:
      return FailureCause::kBounds;
    case absl::StatusCode::kInvalidArgument:
      return FailureCause::kInvalid;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kFailedPrecondition:
      return FailureCause::kRefused;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
      return FailureCause::kTransport;
    case absl::StatusCode::kCancelled:
      return FailureCause::kAborted;
    default:
      return FailureCause::kOther;
  }
}

}  // namespace kvrail::session
