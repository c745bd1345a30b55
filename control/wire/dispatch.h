// How a Prefill tells the two Decode → Prefill messages apart (CACHEPD §3.2.1).
#ifndef KVRAIL_CONTROL_WIRE_DISPATCH_H_
#define KVRAIL_CONTROL_WIRE_DISPATCH_H_

#include <string>

#include "absl/types/span.h"

namespace kvrail::wire {

enum class MessageKind {
  kRegistration,   // frame 0 is "None": parse with ParseRegistration
  kPreallocation,  // any other ASCII frame 0: parse with ParsePreallocation
  kDropped,        // no frame 0, or frame 0 is not ASCII: log and drop, nobody to answer
};

// The handler the reference's `_handle_bootstrap_message` picks for `frames`. Looks at frame 0
// only, so the chosen parser may still reject the message (a lowercase "none" is a
// pre-allocation with too many frames, for example).
MessageKind Classify(absl::Span<const std::string> frames);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_DISPATCH_H_
