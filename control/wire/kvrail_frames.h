// What kvrail's own messages beside CachePD share (fence.h, proof.h): frame 0 is a magic that
// starts with byte 0xFF, so it is not ASCII; a CachePD peer that is not kvrail drops and logs
// the message (CACHEPD §3.2.1), and no CachePD message can be mistaken for one.
#ifndef KVRAIL_CONTROL_WIRE_KVRAIL_FRAMES_H_
#define KVRAIL_CONTROL_WIRE_KVRAIL_FRAMES_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

// Whether frame 0 of `frames` is `magic`.
bool HasMagic(absl::Span<const std::string> frames, absl::string_view magic);

// invalid-frame, naming `what`, unless `frames` has exactly `count` frames and frame 0 is
// `magic`.
absl::Status CheckShape(absl::Span<const std::string> frames, absl::string_view magic,
                        absl::string_view what, size_t count);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_KVRAIL_FRAMES_H_
