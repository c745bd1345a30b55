// `kvrail inspect contract|manifest|registration|preallocation|status`: decode what a peer
// sent (or what an engine publishes) and print it as JSON, or print why it is rejected.
#ifndef KVRAIL_TOOLS_INSPECT_H_
#define KVRAIL_TOOLS_INSPECT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::tools {

struct InspectOptions {
  std::string kind;                // contract, manifest, registration, preallocation, status
  std::string peer_contract_path;  // contract: --peer FILE (the decode side's contract)
  // contract: --as snapshot|2026-09, the CachePD form to print (CACHEPD §12.1); empty: the
  // form the input was in.
  std::string contract_form;
  std::string contract_path;            // manifest: --contract FILE (validate against it, §5.3)
  bool lenient_status = false;          // status: --lenient, the reference decode's own parser
  std::vector<std::string> hex_frames;  // frames given as arguments (else read from stdin)
};

// Runs one inspection over `input` (the text read from stdin) and returns the JSON to print,
// or the error to print as "error: <category>: <message>".
absl::StatusOr<std::string> Inspect(const InspectOptions& options, absl::string_view input);

// Splits stdin text into frames: one lowercase or uppercase hex frame per line, an empty line
// being an empty frame; a final newline does not start a frame. Non-hex text is an
// invalid-frame error naming the line.
absl::StatusOr<std::vector<std::string>> FramesFromHexLines(absl::string_view text);

// Decodes hex frames given as arguments.
absl::StatusOr<std::vector<std::string>> FramesFromHexArgs(const std::vector<std::string>& args);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_INSPECT_H_
