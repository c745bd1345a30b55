// The canonical unsigned ASCII integer of CachePD frames (CACHEPD §3.1, §9.1).
#ifndef KVRAIL_CONTROL_WIRE_ASCII_UINT_H_
#define KVRAIL_CONTROL_WIRE_ASCII_UINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::wire {

// Reads `frame` as a canonical uint in [min, max] (the reference's `_bounded_ascii_uint`):
// 1 to len(FormatUint(max)) bytes, every byte '0'..'9', no leading '0' unless the frame is the
// single byte "0", and a value in [min, max]. Requires min <= max.
//
// On failure returns an invalid-frame error whose message starts with `what` (for example
// "registration frame 2 (port)") and says either "must be canonical unsigned ASCII" (the first
// three rules: signs, spaces, "0x", '_' and over-long frames) or "is out of range".
absl::StatusOr<uint64_t> ParseCanonicalUint(absl::string_view frame, uint64_t min, uint64_t max,
                                            absl::string_view what);

// The canonical text of `value`: decimal digits with no sign and no leading zero.
std::string FormatUint(uint64_t value);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_ASCII_UINT_H_
