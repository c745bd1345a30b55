#include "control/wire/row_staging.h"

#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/kvrail_frames.h"
#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

constexpr size_t kStagingOfferFrames = 5;
constexpr size_t kStagingAnswerFrames = 4;
constexpr absl::string_view kStaged = "staged";
constexpr absl::string_view kInPlace = "in_place";

}  // namespace

bool IsStagingOffer(absl::Span<const std::string> frames) {
  return HasMagic(frames, kStagingOfferMagic);
}

bool IsStagingAnswer(absl::Span<const std::string> frames) {
  return HasMagic(frames, kStagingAnswerMagic);
}

absl::StatusOr<StagingOffer> ParseStagingOffer(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(
      CheckShape(frames, kStagingOfferMagic, "staging offer", kStagingOfferFrames));
  StagingOffer offer;
  KVRAIL_ASSIGN_OR_RETURN(
      offer.room, ParseCanonicalUint(frames[1], 0, kMaxRoom, "staging offer frame 1 (room)"));
  if (frames[2].empty() || frames[2].size() > kMaxSessionIdBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("staging offer frame 2 (session id) has ", frames[2].size(),
                                  " bytes, requires 1 to ", kMaxSessionIdBytes));
  }
  offer.session_id = frames[2];
  KVRAIL_ASSIGN_OR_RETURN(offer.address, ParseCanonicalUint(frames[3], 1, UINT64_MAX,
                                                            "staging offer frame 3 (address)"));
  KVRAIL_ASSIGN_OR_RETURN(
      offer.bytes, ParseCanonicalUint(frames[4], 1, UINT64_MAX, "staging offer frame 4 (bytes)"));
  if (offer.address > UINT64_MAX - offer.bytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("staging offer: a slot of ", offer.bytes, " bytes at ",
                                  offer.address, " wraps around the address space"));
  }
  return offer;
}

absl::StatusOr<std::vector<std::string>> BuildStagingOffer(const StagingOffer& offer) {
  std::vector<std::string> frames = {std::string(kStagingOfferMagic), FormatUint(offer.room),
                                     offer.session_id, FormatUint(offer.address),
                                     FormatUint(offer.bytes)};
  if (absl::Status valid = ParseStagingOffer(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build staging offer");
  }
  return frames;
}

absl::StatusOr<StagingAnswer> ParseStagingAnswer(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(
      CheckShape(frames, kStagingAnswerMagic, "staging answer", kStagingAnswerFrames));
  StagingAnswer answer;
  KVRAIL_ASSIGN_OR_RETURN(
      answer.room, ParseCanonicalUint(frames[1], 0, kMaxRoom, "staging answer frame 1 (room)"));
  KVRAIL_ASSIGN_OR_RETURN(
      const uint64_t rank,
      ParseCanonicalUint(frames[2], 0, kMaxPrefillRank, "staging answer frame 2 (prefill rank)"));
  answer.prefill_rank = static_cast<uint32_t>(rank);
  if (frames[3] != kStaged && frames[3] != kInPlace) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     "staging answer frame 3 must be \"staged\" or \"in_place\"");
  }
  answer.staged = frames[3] == kStaged;
  return answer;
}

absl::StatusOr<std::vector<std::string>> BuildStagingAnswer(const StagingAnswer& answer) {
  std::vector<std::string> frames = {std::string(kStagingAnswerMagic), FormatUint(answer.room),
                                     FormatUint(answer.prefill_rank),
                                     std::string(answer.staged ? kStaged : kInPlace)};
  if (absl::Status valid = ParseStagingAnswer(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build staging answer");
  }
  return frames;
}

}  // namespace kvrail::wire
