#include "control/wire/dispatch.h"

#include "control/wire/frame_text.h"
#include "control/wire/limits.h"

namespace kvrail::wire {

MessageKind Classify(absl::Span<const std::string> frames) {
  if (frames.empty() || !IsAscii(frames[0])) {
    return MessageKind::kDropped;
  }
  if (frames[0] == kRegistrationMarker) {
    return MessageKind::kRegistration;
  }
  return MessageKind::kPreallocation;
}

}  // namespace kvrail::wire
