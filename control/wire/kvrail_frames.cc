#include "control/wire/kvrail_frames.h"

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::wire {

bool HasMagic(absl::Span<const std::string> frames, absl::string_view magic) {
  return !frames.empty() && frames[0] == magic;
}

absl::Status CheckShape(absl::Span<const std::string> frames, absl::string_view magic,
                        absl::string_view what, size_t count) {
  if (frames.size() != count) {
    return MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat(what, ": got ", frames.size(), " frames, requires exactly ", count));
  }
  if (frames[0] != magic) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(what, " frame 0 is not the ", what, " magic"));
  }
  return absl::OkStatus();
}

}  // namespace kvrail::wire
