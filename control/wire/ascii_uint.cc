#include "control/wire/ascii_uint.h"

#include <cstddef>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "control/wire/frame_text.h"
#include "engine/base/error.h"

namespace kvrail::wire {

absl::StatusOr<uint64_t> ParseCanonicalUint(absl::string_view frame, uint64_t min, uint64_t max,
                                            absl::string_view what) {
  const size_t max_digits = FormatUint(max).size();
  bool canonical =
      !frame.empty() && frame.size() <= max_digits && !(frame.size() > 1 && frame.front() == '0');
  uint64_t value = 0;
  bool overflow = false;
  for (char c : frame) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      canonical = false;
      break;
    }
    const auto digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      overflow = true;
    }
    value = value * 10 + digit;
  }
  if (!canonical) {
    const std::string digits = max_digits == 1
                                   ? std::string("1 decimal digit")
                                   : absl::StrCat("1 to ", max_digits, " decimal digits");
    return MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat(what, ": ", QuoteFrame(frame), " must be canonical unsigned ASCII: ", digits,
                     ", no sign, space or leading zero (CACHEPD §3.1)"));
  }
  if (overflow || value < min || value > max) {
    // A canonical frame holds only digits, so it can be shown as it is.
    return MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat(what, ": ", frame, " is out of range [", min, ", ", max, "] (CACHEPD §3.1)"));
  }
  return value;
}

std::string FormatUint(uint64_t value) { return absl::StrCat(value); }

}  // namespace kvrail::wire
