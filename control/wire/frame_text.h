// How the CachePD codecs inspect frame bytes and quote them in error messages.
#ifndef KVRAIL_CONTROL_WIRE_FRAME_TEXT_H_
#define KVRAIL_CONTROL_WIRE_FRAME_TEXT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvrail::wire {

// True when every byte of `bytes` is below 0x80, i.e. when Python's bytes.decode("ascii")
// accepts it. The empty string is ASCII.
bool IsAscii(absl::string_view bytes);

// Returns OK when `frame` is ASCII. Otherwise returns an invalid-frame error naming `what` (for
// example "registration frame 1 (endpoint)"), the first offending byte and its offset, and the
// spec `section` (for example "§3.2").
absl::Status RequireAscii(absl::string_view frame, absl::string_view what,
                          absl::string_view section);

// `frame` as a double-quoted, C-escaped string for one-line error messages. Frames longer than
// 32 bytes are cut after 32 bytes and followed by their total length.
std::string QuoteFrame(absl::string_view frame);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_FRAME_TEXT_H_
