// JSON text as the reference bootstrap server writes it: aiohttp's json_response, which is
// Python's json.dumps with its default separators (", " and ": ") and ensure_ascii
// (CACHEPD §2). Clients must parse it as JSON; kvrail still writes the same bytes, so a
// capture of either server reads the same.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_PYTHON_JSON_H_
#define KVRAIL_CONTROL_BOOTSTRAP_PYTHON_JSON_H_

#include <nlohmann/json.hpp>
#include <string>

namespace kvrail::bootstrap {

// Writes `value` as json.dumps(value) does: members in insertion order, ", " between items,
// ": " after names, every character outside 0x20..0x7E escaped (\", \\, \b, \f, \n, \r, \t,
// else \uXXXX in lowercase hex, surrogate pairs beyond the BMP), "/" unescaped.
// Requires every string to be valid UTF-8 (nlohmann's parser guarantees it); a byte that is
// not is written as \ufffd. Floats are not used by the bootstrap API and are written by
// nlohmann's own formatter.
std::string DumpPythonJson(const nlohmann::ordered_json& value);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_PYTHON_JSON_H_
