#include "control/wire/frame_text.h"

#include <cstddef>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

constexpr size_t kQuotedBytes = 32;

}  // namespace

bool IsAscii(absl::string_view bytes) {
  for (char c : bytes) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      return false;
    }
  }
  return true;
}

absl::Status RequireAscii(absl::string_view frame, absl::string_view what,
                          absl::string_view section) {
  for (size_t i = 0; i < frame.size(); ++i) {
    const auto byte = static_cast<unsigned char>(frame[i]);
    if (byte >= 0x80) {
      return MakeError(ErrorCategory::kInvalidFrame,
                       absl::StrFormat("%s: byte 0x%02x at offset %d is not ASCII (CACHEPD %s)",
                                       what, byte, i, section));
    }
  }
  return absl::OkStatus();
}

std::string QuoteFrame(absl::string_view frame) {
  if (frame.size() <= kQuotedBytes) {
    return absl::StrCat("\"", absl::CHexEscape(frame), "\"");
  }
  return absl::StrCat("\"", absl::CHexEscape(frame.substr(0, kQuotedBytes)), "\"... (",
                      frame.size(), " bytes)");
}

}  // namespace kvrail::wire
