#include "control/wire/status.h"

#include <limits>
#include <utility>

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

}  // namespace

bool operator==(const StatusMessage& a, const StatusMessage& b) {
  return a.room == b.room && a.status == b.status && a.prefill_rank == b.prefill_rank &&
         a.bootstrap_token == b.bootstrap_token && a.spec_candidate_ids == b.spec_candidate_ids;
}

bool operator!=(const StatusMessage& a, const StatusMessage& b) { return !(a == b); }

absl::StatusOr<std::vector<std::string>> BuildStatus(const StatusMessage& message) {
  std::vector<std::string> frames = {
      absl::StrCat(message.room),
      absl::StrCat(message.status),
      absl::StrCat(message.prefill_rank),
      absl::StrCat(message.bootstrap_token),
      message.spec_candidate_ids ? EncodeInt32List(*message.spec_candidate_ids) : std::string(),
  };
  // Checking the frames themselves keeps the builder from ever emitting what the parser rejects.
  if (absl::Status valid = ParseStatus(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build status");
  }
  return frames;
}

absl::StatusOr<StatusMessage> ParseStatus(absl::Span<const std::string> frames) {
  if (frames.size() != kStatusFrameCount) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("status: got ", frames.size(),
                                  " frames, requires exactly 5 (CACHEPD §3.4, §9.3)"));
  }
  StatusMessage message;
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
  return message;
}

absl::StatusOr<StatusMessage> ParseStatusLenient(absl::Span<const std::string> frames) {
  if (frames.size() < kMinLenientStatusFrameCount) {
    return MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat("status: got ", frames.size(), " frames, requires at least 3 (CACHEPD §3.4)"));
  }
  StatusMessage message;
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
  return message;
}

}  // namespace kvrail::wire
