// Reads the CachePD vectors copied into tests/data/cachepd (format: tests/data/cachepd/VECTORS.md).
#ifndef KVRAIL_TESTS_SUPPORT_VECTORS_H_
#define KVRAIL_TESTS_SUPPORT_VECTORS_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvrail::testing {

// Parses tests/data/cachepd/<file> from the test's runfiles; aborts the test binary with a
// message if the file is missing (a build mistake, not a test outcome).
nlohmann::json LoadVectors(absl::string_view file);

// Lowercase hex <-> bytes. FromHex aborts on malformed hex (vectors are trusted input).
std::string FromHex(absl::string_view hex);
std::string ToHex(absl::string_view bytes);

// Expands {"kind":"pad_right",...} and {"kind":"nest",...} generators.
std::string ExpandGenerator(const nlohmann::json& generator);

// The input bytes of a contracts.json / manifests.json entry: input_hex, else
// input_generator, else input_text.
std::string VectorInput(const nlohmann::json& entry);

// The frames of a frames.json / status.json case: `frames_hex`, each null entry expanded
// from the `frame_generators` entry of the same index.
std::vector<std::string> VectorFrames(const nlohmann::json& entry);

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_SUPPORT_VECTORS_H_
