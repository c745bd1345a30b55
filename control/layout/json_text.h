// Strict JSON text in and canonical JSON text out, for the CachePD contract and manifest wires.
//
// The reference (Python json) accepts several inputs that a production peer never emits
// (CACHEPD §4.3 item 7): BOMs and UTF-16/32 text, NaN and Infinity, duplicate member names,
// unbounded nesting. kvrail rejects all of them with a clear error instead.
#ifndef KVRAIL_CONTROL_LAYOUT_JSON_TEXT_H_
#define KVRAIL_CONTROL_LAYOUT_JSON_TEXT_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/base/error.h"

namespace kvrail::layout {

// Deepest nesting accepted. A contract needs 6 levels; the reference dies of RecursionError
// near 1000 (CACHEPD §4.3 item 7), kvrail refuses anything deeper than this.
inline constexpr int kMaxJsonDepth = 32;

// Parses `text` (the payload called `what`, e.g. "contract") as one JSON value.
// Requires: 1 <= text.size() <= max_bytes, UTF-8 without a byte-order mark, RFC 8259 syntax
// (no NaN/Infinity), no member name repeated within one object, nesting <= kMaxJsonDepth.
// Every failure is an error of `category` naming `what` and the rule.
absl::StatusOr<nlohmann::json> ParseStrictJson(absl::string_view text, size_t max_bytes,
                                               ErrorCategory category, absl::string_view what,
                                               absl::string_view spec_section);

// Writes `value` the way Python's json.dumps(separators=(",", ":"), ensure_ascii=True) does:
// no whitespace, members in insertion order, every character outside 0x20..0x7E escaped as
// \uXXXX with lowercase hex (surrogate pairs beyond the BMP), "/" unescaped (CACHEPD §4.2).
// Requires every string in `value` to be valid UTF-8; returns an error otherwise.
absl::StatusOr<std::string> DumpCanonical(const nlohmann::ordered_json& value,
                                          ErrorCategory category, absl::string_view what);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_JSON_TEXT_H_
