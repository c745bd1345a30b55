#include "control/wire/python_int.h"

#include <cstddef>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "control/wire/frame_text.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

// Python's int() strips str.strip() whitespace; after an ASCII decode that is these six bytes.
// (\x1c to \x1f are str whitespace too, but int() rejects them.)
bool IsPythonIntSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

constexpr uint64_t kInt64Magnitude = uint64_t{1} << 63;  // |INT64_MIN|

}  // namespace

absl::StatusOr<int64_t> ParsePythonInt(absl::string_view frame, int64_t min, int64_t max,
                                       absl::string_view what) {
  KVRAIL_RETURN_IF_ERROR(RequireAscii(frame, what, "§3.4"));

  absl::string_view text = frame;
  while (!text.empty() && IsPythonIntSpace(text.front())) {
    text.remove_prefix(1);
  }
  while (!text.empty() && IsPythonIntSpace(text.back())) {
    text.remove_suffix(1);
  }
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  // digit ('_'? digit)*
  std::string digits;
  bool after_digit = false;
  bool well_formed = true;
  for (char c : text) {
    if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      digits.push_back(c);
      after_digit = true;
    } else if (c == '_' && after_digit) {
      after_digit = false;
    } else {
      well_formed = false;
      break;
    }
  }
  if (!well_formed || !after_digit) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(what, ": ", QuoteFrame(frame),
                                  " is not a base-10 integer as Python int() reads it: optional "
                                  "spaces and sign, digits with single '_' between them "
                                  "(CACHEPD §3.4)"));
  }

  const size_t first = digits.find_first_not_of('0');
  const std::string magnitude_text = first == std::string::npos ? "0" : digits.substr(first);
  uint64_t magnitude = 0;
  bool fits = absl::SimpleAtoi(magnitude_text, &magnitude);
  int64_t value = 0;
  if (fits && !negative && magnitude < kInt64Magnitude) {
    value = static_cast<int64_t>(magnitude);
  } else if (fits && negative && magnitude <= kInt64Magnitude) {
    value = magnitude == kInt64Magnitude ? std::numeric_limits<int64_t>::min()
                                         : -static_cast<int64_t>(magnitude);
  } else {
    fits = false;
  }
  if (!fits || value < min || value > max) {
    const bool shows_minus = negative && magnitude_text != "0";
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(what, ": ", shows_minus ? "-" : "", magnitude_text,
                                  " is out of range [", min, ", ", max, "] (CACHEPD §3.4)"));
  }
  return value;
}

}  // namespace kvrail::wire
