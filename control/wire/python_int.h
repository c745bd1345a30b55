// The lenient integer reading of the reference's status parser (CACHEPD §3.4).
//
// kvrail never emits such text (CACHEPD §9.1); it only reads it, in ParseStatusLenient.
#ifndef KVRAIL_CONTROL_WIRE_PYTHON_INT_H_
#define KVRAIL_CONTROL_WIRE_PYTHON_INT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::wire {

// Reads `frame` as the reference does: bytes.decode("ascii"), then Python int(text) in base 10.
// Accepted: surrounding ASCII whitespace (space, \t, \n, \v, \f, \r), one optional '+' or '-',
// leading zeros, and single '_' between two digits. Everything else ("0x5", "1__0", "_1", "",
// "- 5", NUL bytes, ...) is rejected, as Python rejects it.
//
// Returns the value when it lies in [min, max]. Requires min <= max. On failure returns an
// invalid-frame error that starts with `what` and says "is not ASCII", "is not a base-10
// integer as Python int() reads it" or "is out of range [min, max]"; the last is kvrail's own
// bound, since Python integers are unbounded.
absl::StatusOr<int64_t> ParsePythonInt(absl::string_view frame, int64_t min, int64_t max,
                                       absl::string_view what);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_PYTHON_INT_H_
