#include "control/wire/fence.h"

#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/kvrail_frames.h"
#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

constexpr size_t kFenceRequestFrames = 3;
constexpr size_t kFencedAnswerFrames = 4;
constexpr absl::string_view kProven = "proven";
constexpr absl::string_view kUnproven = "unproven";

}  // namespace

bool IsFenceRequest(absl::Span<const std::string> frames) {
  return HasMagic(frames, kFenceRequestMagic);
}

bool IsFencedAnswer(absl::Span<const std::string> frames) { return HasMagic(frames, kFencedMagic); }

absl::StatusOr<std::vector<std::string>> BuildFenceRequest(const FenceRequest& request) {
  std::vector<std::string> frames = {std::string(kFenceRequestMagic), FormatUint(request.room),
                                     request.session_id};
  if (absl::Status valid = ParseFenceRequest(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build fence request");
  }
  return frames;
}

absl::StatusOr<FenceRequest> ParseFenceRequest(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(
      CheckShape(frames, kFenceRequestMagic, "fence request", kFenceRequestFrames));
  FenceRequest request;
  KVRAIL_ASSIGN_OR_RETURN(
      request.room, ParseCanonicalUint(frames[1], 0, kMaxRoom, "fence request frame 1 (room)"));
  if (frames[2].empty() || frames[2].size() > kMaxSessionIdBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("fence request frame 2 (session id) has ", frames[2].size(),
                                  " bytes, requires 1 to ", kMaxSessionIdBytes));
  }
  request.session_id = frames[2];
  return request;
}

absl::StatusOr<std::vector<std::string>> BuildFencedAnswer(const FencedAnswer& answer) {
  std::vector<std::string> frames = {std::string(kFencedMagic), FormatUint(answer.room),
                                     FormatUint(answer.prefill_rank),
                                     std::string(answer.proven ? kProven : kUnproven)};
  if (absl::Status valid = ParseFencedAnswer(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build fence answer");
  }
  return frames;
}

absl::StatusOr<FencedAnswer> ParseFencedAnswer(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(CheckShape(frames, kFencedMagic, "fence answer", kFencedAnswerFrames));
  FencedAnswer answer;
  KVRAIL_ASSIGN_OR_RETURN(
      answer.room, ParseCanonicalUint(frames[1], 0, kMaxRoom, "fence answer frame 1 (room)"));
  KVRAIL_ASSIGN_OR_RETURN(
      const uint64_t rank,
      ParseCanonicalUint(frames[2], 0, kMaxPrefillRank, "fence answer frame 2 (prefill rank)"));
  answer.prefill_rank = static_cast<uint32_t>(rank);
  if (frames[3] != kProven && frames[3] != kUnproven) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     "fence answer frame 3 must be \"proven\" or \"unproven\"");
  }
  answer.proven = frames[3] == kProven;
  return answer;
}

}  // namespace kvrail::wire
