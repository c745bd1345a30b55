#include "control/wire/status.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/base/casts.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/byte_order.h"
#include "control/wire/frame_text.h"
#include "control/wire/limits.h"
#include "control/wire/python_int.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

constexpr absl::string_view kTokenWhat = "status frame 3 (bootstrap token)";
constexpr absl::string_view kSpecWhat = "status frame 4 (speculative ids)";
constexpr absl::string_view kCachedWhat = "status frame 5 (cached tokens)";
constexpr absl::string_view kLogprobWhat = "status frame 6 (bootstrap logprob)";

absl::StatusOr<int64_t> ParseStrictToken(absl::string_view frame) {
  if (frame == "-1") {
    return kNoBootstrapToken;
  }
  if (!frame.empty() && frame.front() == '-') {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(kTokenWhat, ": ", QuoteFrame(frame),
                                  " must be \"-1\" (no token) or canonical unsigned ASCII "
                                  "(CACHEPD §3.4, §9.3)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t token, ParseCanonicalUint(frame, 0, kMaxRoom, kTokenWhat));
  return static_cast<int64_t>(token);
}

// Frame 4: little-endian int32 values; an empty frame means none (CACHEPD §3.4, §9.3).
absl::StatusOr<std::optional<std::vector<int32_t>>> ParseSpecCandidateIds(absl::string_view frame) {
  if (frame.size() % 4 != 0) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(kSpecWhat, ": ", frame.size(),
                                  " bytes, must be a multiple of 4 (int32 values) (CACHEPD §3.4)"));
  }
  if (frame.empty()) {
    return std::optional<std::vector<int32_t>>();
  }
  return std::optional<std::vector<int32_t>>(DecodeInt32List(frame));
}

// Frame 6: 8 little-endian bytes of an IEEE-754 double; an empty frame means none (CACHEPD
// §12.9). Any other length is an error, as struct.unpack("<d") raises.
absl::StatusOr<std::optional<double>> ParseLogprobBytes(absl::string_view frame) {
  if (frame.empty()) {
    return std::optional<double>();
  }
  if (frame.size() != kBootstrapLogprobBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(kLogprobWhat, ": ", frame.size(),
                                  " bytes, must be empty (none) or exactly 8 (a little-endian "
                                  "IEEE-754 double) (CACHEPD §12.9)"));
  }
  return std::optional<double>(absl::bit_cast<double>(DecodeLittleEndian64(frame)));
}

// The strict reader's rule on the logprob's value (see status.h): NaN and +inf are refused.
absl::Status CheckStrictLogprob(std::optional<double> logprob) {
  if (!logprob.has_value() || !(std::isnan(*logprob) || *logprob == HUGE_VAL)) {
    return absl::OkStatus();
  }
  return MakeError(ErrorCategory::kInvalidFrame,
                   absl::StrCat(kLogprobWhat, ": ", *logprob,
                                " is not a log-probability (NaN and +inf are refused; CACHEPD "
                                "§12.9)"));
}

bool SameLogprob(std::optional<double> a, std::optional<double> b) {
  if (a.has_value() != b.has_value()) return false;
  return !a.has_value() || absl::bit_cast<uint64_t>(*a) == absl::bit_cast<uint64_t>(*b);
}

}  // namespace

StatusForm StatusFormOf(absl::Span<const std::string> frames) {
  return frames.size() > kCachedTokensFrameIndex ? StatusForm::k2026_09 : StatusForm::kSnapshot;
}

bool operator==(const StatusMessage& a, const StatusMessage& b) {
  return a.room == b.room && a.status == b.status && a.prefill_rank == b.prefill_rank &&
         a.bootstrap_token == b.bootstrap_token && a.spec_candidate_ids == b.spec_candidate_ids &&
         a.cached_tokens == b.cached_tokens &&
         SameLogprob(a.bootstrap_logprob, b.bootstrap_logprob) && a.form == b.form;
}

bool operator!=(const StatusMessage& a, const StatusMessage& b) { return !(a == b); }

absl::StatusOr<std::vector<std::string>> BuildStatus(const StatusMessage& message,
                                                     StatusForm form) {
  std::vector<std::string> frames = {
      absl::StrCat(message.room),
      absl::StrCat(message.status),
      absl::StrCat(message.prefill_rank),
      absl::StrCat(message.bootstrap_token),
      message.spec_candidate_ids ? EncodeInt32List(*message.spec_candidate_ids) : std::string(),
  };
  if (form == StatusForm::k2026_09) {  // CACHEPD §12.9
    frames.push_back(absl::StrCat(message.cached_tokens));
    frames.push_back(
        message.bootstrap_logprob.has_value()
            ? EncodeLittleEndian64(absl::bit_cast<uint64_t>(*message.bootstrap_logprob))
            : std::string());
  }
  // Checking the frames themselves keeps the builder from ever emitting what the parser rejects.
  if (absl::Status valid = ParseStatus(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build status");
  }
  return frames;
}

absl::StatusOr<StatusMessage> ParseStatus(absl::Span<const std::string> frames) {
  if (frames.size() < kStatusFrameCount || frames.size() > kStatusFrameCount2026_09) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("status: got ", frames.size(),
                                  " frames, requires 5 (snapshot) or 6 or 7 (2026-09) "
                                  "(CACHEPD §3.4, §12.9)"));
  }
  StatusMessage message;
  message.form = StatusFormOf(frames);
  KVRAIL_ASSIGN_OR_RETURN(message.room,
                          ParseCanonicalUint(frames[0], 0, kMaxRoom, "status frame 0 (room)"));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t status, ParseCanonicalUint(frames[1], 0, kMaxTransferPoll,
                                                                    "status frame 1 (status)"));
  message.status = static_cast<int>(status);
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t rank, ParseCanonicalUint(frames[2], 0, kMaxPrefillRank,
                                                                  "status frame 2 (prefill rank)"));
  message.prefill_rank = static_cast<uint32_t>(rank);
  KVRAIL_ASSIGN_OR_RETURN(message.bootstrap_token, ParseStrictToken(frames[3]));
  KVRAIL_ASSIGN_OR_RETURN(message.spec_candidate_ids, ParseSpecCandidateIds(frames[4]));
  if (frames.size() > kCachedTokensFrameIndex) {
    KVRAIL_ASSIGN_OR_RETURN(
        const uint64_t cached,
        ParseCanonicalUint(frames[kCachedTokensFrameIndex], 0,
                           static_cast<uint64_t>(kMaxCachedTokens), kCachedWhat));
    message.cached_tokens = static_cast<int64_t>(cached);
  }
  if (frames.size() > kBootstrapLogprobFrameIndex) {
    KVRAIL_ASSIGN_OR_RETURN(message.bootstrap_logprob,
                            ParseLogprobBytes(frames[kBootstrapLogprobFrameIndex]));
    KVRAIL_RETURN_IF_ERROR(CheckStrictLogprob(message.bootstrap_logprob));
  }
  return message;
}

absl::StatusOr<StatusMessage> ParseStatusLenient(absl::Span<const std::string> frames) {
  if (frames.size() < kMinLenientStatusFrameCount) {
    return MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat("status: got ", frames.size(), " frames, requires at least 3 (CACHEPD §3.4)"));
  }
  StatusMessage message;
  message.form = StatusFormOf(frames);
  KVRAIL_ASSIGN_OR_RETURN(
      const int64_t room,
      ParsePythonInt(frames[0], 0, static_cast<int64_t>(kMaxRoom), "status frame 0 (room)"));
  message.room = static_cast<uint64_t>(room);
  KVRAIL_ASSIGN_OR_RETURN(
      const int64_t status,
      ParsePythonInt(frames[1], std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                     "status frame 1 (status)"));
  message.status = static_cast<int>(status);
  KVRAIL_ASSIGN_OR_RETURN(const int64_t rank,
                          ParsePythonInt(frames[2], 0, std::numeric_limits<uint32_t>::max(),
                                         "status frame 2 (prefill rank)"));
  message.prefill_rank = static_cast<uint32_t>(rank);
  if (frames.size() > 3) {
    KVRAIL_ASSIGN_OR_RETURN(message.bootstrap_token,
                            ParsePythonInt(frames[3], std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max(), kTokenWhat));
  }
  if (frames.size() > 4) {
    KVRAIL_ASSIGN_OR_RETURN(message.spec_candidate_ids, ParseSpecCandidateIds(frames[4]));
  }
  // CACHEPD §12.9: frame 6 is read before frame 5, so when both are bad the logprob's error is
  // the one reported.
  if (frames.size() > kBootstrapLogprobFrameIndex) {
    KVRAIL_ASSIGN_OR_RETURN(message.bootstrap_logprob,
                            ParseLogprobBytes(frames[kBootstrapLogprobFrameIndex]));
  }
  if (frames.size() > kCachedTokensFrameIndex) {
    KVRAIL_ASSIGN_OR_RETURN(
        message.cached_tokens,
        ParsePythonInt(frames[kCachedTokensFrameIndex], std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(), kCachedWhat));
  }
  return message;
}

}  // namespace kvrail::wire
