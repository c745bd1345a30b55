#include "control/wire/digest.h"

#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/byte_order.h"
#include "control/wire/kvrail_frames.h"
#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {

bool IsRoomDigest(absl::Span<const std::string> frames) {
  return HasMagic(frames, kRoomDigestMagic);
}

absl::StatusOr<RoomDigestMessage> ParseRoomDigest(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(CheckShape(frames, kRoomDigestMagic, "room digest", 4));
  RoomDigestMessage message;
  KVRAIL_ASSIGN_OR_RETURN(message.room,
                          ParseCanonicalUint(frames[1], 0, kMaxRoom, "room digest frame 1 (room)"));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t rank,
                          ParseCanonicalUint(frames[2], 0, 1023, "room digest frame 2 (rank)"));
  message.prefill_rank = static_cast<uint32_t>(rank);
  if (frames[3].size() != kRoomDigestBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("room digest frame 3 (digest) has ", frames[3].size(),
                                  " bytes, requires ", kRoomDigestBytes));
  }
  message.digest = DecodeLittleEndian64(frames[3]);
  return message;
}

absl::StatusOr<std::vector<std::string>> BuildRoomDigest(const RoomDigestMessage& message) {
  std::vector<std::string> frames = {std::string(kRoomDigestMagic), FormatUint(message.room),
                                     FormatUint(message.prefill_rank),
                                     EncodeLittleEndian64(message.digest)};
  if (absl::Status valid = ParseRoomDigest(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build room digest");
  }
  return frames;
}

}  // namespace kvrail::wire
