#include "control/sidecar/sender_check.h"

#include "absl/strings/str_format.h"
#include "control/sidecar/session_key.h"
#include "control/wire/digest.h"
#include "control/wire/fence.h"
#include "control/wire/outcome.h"
#include "control/wire/proof.h"
#include "control/wire/row_staging.h"
#include "control/wire/status.h"

namespace kvrail::sidecar {

std::optional<std::pair<uint64_t, uint32_t>> RoomAndRank(absl::Span<const std::string> message) {
  if (wire::IsFencedAnswer(message)) {
    absl::StatusOr<wire::FencedAnswer> answer = wire::ParseFencedAnswer(message);
    if (!answer.ok()) return std::nullopt;
    return std::make_pair(answer->room, answer->prefill_rank);
  }
  if (wire::IsRoomDigest(message)) {
    absl::StatusOr<wire::RoomDigestMessage> digest = wire::ParseRoomDigest(message);
    if (!digest.ok()) return std::nullopt;
    return std::make_pair(digest->room, digest->prefill_rank);
  }
  if (wire::IsRoomOutcome(message)) {
    absl::StatusOr<wire::RoomOutcomeMessage> outcome = wire::ParseRoomOutcome(message);
    if (!outcome.ok()) return std::nullopt;
    return std::make_pair(outcome->room, outcome->prefill_rank);
  }
  if (wire::IsStagingAnswer(message)) {
    absl::StatusOr<wire::StagingAnswer> answer = wire::ParseStagingAnswer(message);
    if (!answer.ok()) return std::nullopt;
    return std::make_pair(answer->room, answer->prefill_rank);
  }
  absl::StatusOr<wire::StatusMessage> status = wire::ParseStatusLenient(message);
  if (!status.ok()) return std::nullopt;
  return std::make_pair(status->room, status->prefill_rank);
}

absl::Status SenderCheck::OnProof(absl::Span<const std::string> frames) {
  absl::StatusOr<wire::SenderProof> proof = wire::ParseSenderProof(frames);
  if (!proof.ok()) return proof.status();
  const std::pair<uint64_t, uint32_t> id(proof->room, proof->prefill_rank);
  if (tags_.insert_or_assign(id, std::move(proof->tag)).second) order_.push_back(id);
  while (tags_.size() > max_kept_ && !order_.empty()) {
    tags_.erase(order_.front());
    order_.pop_front();
  }
  // order_ may hold ids already used up; it is trimmed as it goes.
  while (order_.size() > 2 * max_kept_) order_.pop_front();
  return absl::OkStatus();
}

absl::Status SenderCheck::Check(absl::Span<const std::string> message) {
  const std::optional<std::pair<uint64_t, uint32_t>> id = RoomAndRank(message);
  if (!id) {
    return absl::PermissionDeniedError(
        "a message that names no room and prefill rank cannot be proven: dropped");
  }
  auto kept = tags_.find(*id);
  const char* what = wire::IsFencedAnswer(message)    ? "fence answer"
                     : wire::IsRoomDigest(message)    ? "room digest"
                     : wire::IsRoomOutcome(message)   ? "room outcome"
                     : wire::IsStagingAnswer(message) ? "staging answer"
                                                      : "status";
  if (kept == tags_.end()) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s of room %d from prefill rank %d refused: no sender proof came right before it, and "
        "its prefill node proves its messages",
        what, id->first, id->second));
  }
  const bool matches = SessionKey::TagMatches(key_, message, kept->second);
  tags_.erase(kept);
  if (!matches) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s of room %d from prefill rank %d refused: its sender proof does not match it", what,
        id->first, id->second));
  }
  return absl::OkStatus();
}

}  // namespace kvrail::sidecar
