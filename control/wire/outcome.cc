#include "control/wire/outcome.h"

#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/kvrail_frames.h"
#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {

bool IsRoomOutcome(absl::Span<const std::string> frames) {
  return HasMagic(frames, kRoomOutcomeMagic);
}

absl::StatusOr<RoomOutcomeMessage> ParseRoomOutcome(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(CheckShape(frames, kRoomOutcomeMagic, "room outcome", 7));
  RoomOutcomeMessage message;
  KVRAIL_ASSIGN_OR_RETURN(
      message.room, ParseCanonicalUint(frames[1], 0, kMaxRoom, "room outcome frame 1 (room)"));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t rank,
                          ParseCanonicalUint(frames[2], 0, 1023, "room outcome frame 2 (rank)"));
  message.prefill_rank = static_cast<uint32_t>(rank);
  KVRAIL_ASSIGN_OR_RETURN(
      message.bytes, ParseCanonicalUint(frames[3], 0, kMaxRoom, "room outcome frame 3 (bytes)"));
  KVRAIL_ASSIGN_OR_RETURN(
      message.copies, ParseCanonicalUint(frames[4], 0, kMaxRoom, "room outcome frame 4 (copies)"));
  const std::string& cause = frames[5];
  bool word = cause.size() <= kMaxOutcomeCauseBytes;
  for (char c : cause) word = word && ((c >= 'a' && c <= 'z') || c == '_');
  if (!word) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("room outcome frame 5 (cause) must be at most ",
                                  kMaxOutcomeCauseBytes, " of a-z and '_'"));
  }
  const std::string& reason = frames[6];
  bool line = reason.size() <= kMaxOutcomeReasonBytes;
  for (char c : reason) line = line && static_cast<unsigned char>(c) >= 0x20;
  if (!line) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("room outcome frame 6 (reason) must be one line of at most ",
                                  kMaxOutcomeReasonBytes, " bytes, no control byte"));
  }
  message.cause = cause;
  message.reason = reason;
  return message;
}

absl::StatusOr<std::vector<std::string>> BuildRoomOutcome(const RoomOutcomeMessage& message) {
  std::vector<std::string> frames = {std::string(kRoomOutcomeMagic),
                                     FormatUint(message.room),
                                     FormatUint(message.prefill_rank),
                                     FormatUint(message.bytes),
                                     FormatUint(message.copies),
                                     message.cause,
                                     message.reason};
  if (absl::Status valid = ParseRoomOutcome(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build room outcome");
  }
  return frames;
}

}  // namespace kvrail::wire
