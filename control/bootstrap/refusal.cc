#include "control/bootstrap/refusal.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "engine/base/error.h"

namespace kvrail::bootstrap {
namespace {

constexpr absl::string_view kPayloadUrl = "kvrail.dev/bootstrap/http-status";

int StatusFor(Refusal refusal) {
  switch (refusal) {
    case Refusal::kBadRequest:
      return 400;
    case Refusal::kConflict:
      return 409;
    case Refusal::kUnauthorized:
      return 401;
    case Refusal::kReferenceRaises:
      break;
  }
  return 500;
}

}  // namespace

absl::Status Refuse(Refusal refusal, absl::string_view text) {
  // MakeError's message is `text` with control characters written as \xNN; only that is kept.
  const std::string message(MakeError(ErrorCategory::kInvalidFrame, text).message());
  absl::Status status = refusal == Refusal::kConflict       ? absl::FailedPreconditionError(message)
                        : refusal == Refusal::kUnauthorized ? absl::UnauthenticatedError(message)
                                                            : absl::InvalidArgumentError(message);
  status.SetPayload(kPayloadUrl, absl::Cord(std::to_string(StatusFor(refusal))));
  return status;
}

int HttpStatusOf(const absl::Status& status) {
  if (status.ok()) return 200;
  auto payload = status.GetPayload(kPayloadUrl);
  int http = 0;
  if (!payload.has_value()) return 500;
  const std::string text(*payload);
  if (absl::SimpleAtoi(text, &http)) return http;
  return 500;
}

}  // namespace kvrail::bootstrap
