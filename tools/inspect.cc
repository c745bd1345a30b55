#include "tools/inspect.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/peer_messages.h"
#include "control/wire/dispatch.h"
#include "control/wire/status.h"
#include "engine/base/error.h"

namespace kvrail::tools {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<std::string> DecodeHex(absl::string_view hex, absl::string_view what) {
  if (hex.size() % 2 != 0) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(what, ": hex text has an odd number of digits"));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return MakeError(ErrorCategory::kInvalidFrame,
                       absl::StrCat(what, ": '", std::string(1, c), "' is not a hex digit"));
    }
  }
  return absl::HexStringToBytes(hex);
}

absl::StatusOr<std::string> ReadFile(const std::string& path, ErrorCategory category) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(category, absl::StrCat("cannot read file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Hex64(uint64_t value) { return absl::StrFormat("0x%x", value); }

absl::StatusOr<std::string> Dump(const ordered_json& value) {
  return value.dump(2, ' ', /*ensure_ascii=*/true);
}

absl::StatusOr<std::string> InspectContract(const InspectOptions& options,
                                            absl::string_view input) {
  KVRAIL_ASSIGN_OR_RETURN(layout::Contract contract, layout::ParseContract(input));
  layout::Revision form = contract.revision;
  if (!options.contract_form.empty()) {
    std::optional<layout::Revision> named = layout::RevisionFromName(options.contract_form);
    if (!named.has_value()) {
      return MakeError(ErrorCategory::kInvalidContract,
                       absl::StrCat("--as ", options.contract_form,
                                    ": a CachePD revision is snapshot or 2026-09"));
    }
    form = *named;
  }
  KVRAIL_ASSIGN_OR_RETURN(std::string wire, layout::SerializeContract(contract, form));
  if (!options.peer_contract_path.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(std::string peer_text,
                            ReadFile(options.peer_contract_path, ErrorCategory::kInvalidContract));
    absl::StatusOr<layout::Contract> peer = layout::ParseContract(peer_text);
    if (!peer.ok()) {
      return AddContext(peer.status(), absl::StrCat("--peer ", options.peer_contract_path));
    }
    KVRAIL_RETURN_IF_ERROR(layout::CheckPeerContracts(contract, *peer));
  }
  return wire + "\n";
}

absl::StatusOr<std::string> InspectManifest(const InspectOptions& options,
                                            absl::string_view input) {
  KVRAIL_ASSIGN_OR_RETURN(layout::Manifest manifest, layout::ParseManifest(input));
  if (!options.contract_path.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(std::string text,
                            ReadFile(options.contract_path, ErrorCategory::kInvalidContract));
    absl::StatusOr<layout::Contract> contract = layout::ParseContract(text);
    if (!contract.ok()) {
      return AddContext(contract.status(), absl::StrCat("--contract ", options.contract_path));
    }
    KVRAIL_RETURN_IF_ERROR(layout::ValidateManifest(manifest, *contract));
  }
  KVRAIL_ASSIGN_OR_RETURN(std::string wire, layout::SerializeManifest(manifest));
  return wire + "\n";
}

absl::StatusOr<std::string> InspectRegistration(const std::vector<std::string>& frames) {
  if (wire::Classify(frames) != wire::MessageKind::kRegistration) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     "frame 0 is not \"None\": a Prefill would read this as a pre-allocation "
                     "(CACHEPD §3.2.1)");
  }
  KVRAIL_ASSIGN_OR_RETURN(layout::DecodedRegistration decoded, layout::DecodeRegistration(frames));
  KVRAIL_ASSIGN_OR_RETURN(std::string contract, layout::SerializeContract(decoded.contract));
  const wire::Registration& r = decoded.frames;
  ordered_json out = {{"message", "registration"},
                      {"frames", frames.size()},
                      {"endpoint", r.endpoint},
                      {"dst_port", r.port},
                      {"session_id", r.session_id},
                      {"dst_kv_ptr", r.arena_base},
                      {"dst_kv_ptr_hex", Hex64(r.arena_base)},
                      {"contract", contract},
                      {"decode_tp_size", r.decode_tp_size},
                      {"decode_tp_rank", r.decode_tp_rank}};
  return Dump(out);
}

absl::StatusOr<std::string> InspectPreallocation(const std::vector<std::string>& frames) {
  if (wire::Classify(frames) != wire::MessageKind::kPreallocation) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     "frame 0 is \"None\" or missing: a Prefill would not read this as a "
                     "pre-allocation (CACHEPD §3.2.1)");
  }
  KVRAIL_ASSIGN_OR_RETURN(layout::DecodedPreallocation decoded,
                          layout::DecodePreallocation(frames));
  ordered_json manifest = nullptr;
  if (decoded.manifest.has_value()) {
    KVRAIL_ASSIGN_OR_RETURN(std::string wire, layout::SerializeManifest(*decoded.manifest));
    manifest = wire;
  }
  ordered_json out = {{"message", "preallocation"},
                      {"frames", frames.size()},
                      {"room", decoded.frames.room},
                      {"session_id", decoded.frames.session_id},
                      {"is_dummy", decoded.frames.is_dummy()},
                      {"manifest", manifest}};
  return Dump(out);
}

// A status's logprob: a number, null for none, and "nan", "inf" or "-inf" for what JSON has no
// number for (the lenient reader accepts them, CACHEPD §12.9).
ordered_json LogprobJson(std::optional<double> logprob) {
  if (!logprob.has_value()) return nullptr;
  if (std::isnan(*logprob)) return "nan";
  if (std::isinf(*logprob)) return *logprob > 0 ? "inf" : "-inf";
  return *logprob;
}

absl::StatusOr<std::string> InspectStatus(const InspectOptions& options,
                                          const std::vector<std::string>& frames) {
  KVRAIL_ASSIGN_OR_RETURN(wire::StatusMessage status, options.lenient_status
                                                          ? wire::ParseStatusLenient(frames)
                                                          : wire::ParseStatus(frames));
  static constexpr const char* kPollNames[] = {"Failed",          "Bootstrapping", "Bootstrapped",
                                               "WaitingForInput", "Transferring",  "Success"};
  ordered_json spec = nullptr;
  if (status.spec_candidate_ids.has_value()) spec = *status.spec_candidate_ids;
  ordered_json out = {
      {"message", "status"},
      {"frames", frames.size()},
      {"room", status.room},
      {"status", status.status},
      {"status_name",
       status.status >= 0 && status.status <= 5 ? kPollNames[status.status] : "unknown"},
      {"prefill_rank", status.prefill_rank},
      {"bootstrap_token", status.bootstrap_token},
      {"spec_candidate_ids", spec},
      // CACHEPD §12.9: 0 and null from a 5-frame (snapshot) status.
      {"revision", status.form == wire::StatusForm::k2026_09 ? "2026-09" : "snapshot"},
      {"cached_tokens", status.cached_tokens},
      {"bootstrap_logprob", LogprobJson(status.bootstrap_logprob)}};
  return Dump(out);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> FramesFromHexLines(absl::string_view text) {
  std::vector<std::string> frames;
  if (text.empty()) return frames;
  if (text.back() == '\n') text.remove_suffix(1);
  int line = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line;
    absl::string_view hex = absl::StripTrailingAsciiWhitespace(raw);  // tolerate CRLF
    KVRAIL_ASSIGN_OR_RETURN(
        std::string frame,
        DecodeHex(hex, absl::StrCat("stdin line ", line, " (frame ", line - 1, ")")));
    frames.push_back(std::move(frame));
  }
  return frames;
}

absl::StatusOr<std::vector<std::string>> FramesFromHexArgs(const std::vector<std::string>& args) {
  std::vector<std::string> frames;
  for (size_t i = 0; i < args.size(); ++i) {
    KVRAIL_ASSIGN_OR_RETURN(
        std::string frame,
        DecodeHex(args[i], absl::StrCat("argument ", i + 1, " (frame ", i, ")")));
    frames.push_back(std::move(frame));
  }
  return frames;
}

absl::StatusOr<std::string> Inspect(const InspectOptions& options, absl::string_view input) {
  if (options.kind == "contract") return InspectContract(options, input);
  if (options.kind == "manifest") return InspectManifest(options, input);
  std::vector<std::string> frames;
  if (!options.hex_frames.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(frames, FramesFromHexArgs(options.hex_frames));
  } else {
    KVRAIL_ASSIGN_OR_RETURN(frames, FramesFromHexLines(input));
  }
  if (options.kind == "registration") return InspectRegistration(frames);
  if (options.kind == "preallocation") return InspectPreallocation(frames);
  if (options.kind == "status") return InspectStatus(options, frames);
  return absl::InvalidArgumentError(absl::StrCat("unknown inspect kind '", options.kind, "'"));
}

}  // namespace kvrail::tools
