#include "control/bootstrap/registration.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "control/bootstrap/python_json.h"
#include "control/bootstrap/refusal.h"
#include "control/bootstrap/stage_placement.h"
#include "control/wire/python_int.h"
#include "engine/base/error.h"
#include "engine/zmq_auth/key_file.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::json;

// Nesting the body may have. A registration needs 3 levels; the reference dies of
// RecursionError near 1000 (CACHEPD §4.3 item 7), which aiohttp answers with 500.
constexpr int kMaxBodyDepth = 32;

absl::Status Raises(absl::string_view member, absl::string_view problem) {
  return Refuse(Refusal::kReferenceRaises,
                absl::StrCat("registration ", member, ": ", problem, " (CACHEPD §2.1)"));
}

absl::Status BadRequest(absl::string_view member, absl::string_view problem,
                        absl::string_view section = "CACHEPD §2.1") {
  return Refuse(Refusal::kBadRequest,
                absl::StrCat("registration ", member, ": ", problem, " (", section, ")"));
}

// A JSON value quoted for an error message, cut to a readable length.
std::string Quote(const json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  if (text.size() > 64) text = absl::StrCat(text.substr(0, 61), "...");
  return text;
}

// The deepest nesting of `text` outside strings, counted without recursion.
int NestingDepth(absl::string_view text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

const json* Find(const json& body, const char* member) {
  auto it = body.find(member);
  return it == body.end() ? nullptr : &*it;
}

// A member the reference reads with data[member]: a KeyError (500) when absent.
absl::StatusOr<const json*> Required(const json& body, const char* member) {
  const json* value = Find(body, member);
  if (value == nullptr) return Raises(member, "is missing");
  return value;
}

int64_t ClampToInt64(const json& value) {
  if (value.is_number_unsigned()) {
    return static_cast<int64_t>(
        std::min<uint64_t>(value.get<uint64_t>(), std::numeric_limits<int64_t>::max()));
  }
  return value.get<int64_t>();
}

// rank_port and engine_rank: the reference applies Python's int(). A JSON integer or a string
// holding one is read; int() raises (500) on null, lists, objects and other text. It would
// truncate a float and read a bool as 0 or 1; kvrail refuses both (400).
absl::StatusOr<int64_t> ReadPythonInt(const json& body, const char* member) {
  KVRAIL_ASSIGN_OR_RETURN(const json* value, Required(body, member));
  if (value->is_boolean() || value->is_number_float()) {
    return BadRequest(member, absl::StrCat("must be an integer, got ", Quote(*value)));
  }
  if (value->is_number_integer()) return ClampToInt64(*value);
  if (value->is_string()) {
    absl::StatusOr<int64_t> parsed = wire::ParsePythonInt(
        value->get_ref<const std::string&>(), std::numeric_limits<int64_t>::min(),
        std::numeric_limits<int64_t>::max(), member);
    if (!parsed.ok()) {
      return Raises(member,
                    absl::StrCat(Quote(*value), " is not an integer as Python int() reads it"));
    }
    return *parsed;
  }
  return Raises(member, absl::StrCat("int() cannot read ", Quote(*value)));
}

// world_size and dp_size: the reference uses them as they come, in world_size // dp_size, so
// anything but a number raises (500); kvrail also refuses bools and floats (400).
absl::StatusOr<int64_t> ReadSize(const json& body, const char* member) {
  KVRAIL_ASSIGN_OR_RETURN(const json* value, Required(body, member));
  if (value->is_boolean() || value->is_number_float()) {
    return BadRequest(member, absl::StrCat("must be an integer, got ", Quote(*value)));
  }
  if (!value->is_number_integer()) {
    return Raises(member, absl::StrCat("must be an integer, got ", Quote(*value)));
  }
  return ClampToInt64(*value);
}

// Whether Python's a // b is 0, as the reference computes world_size // dp_size. Requires
// b != 0. Decided without dividing, so INT64_MIN // -1 cannot trap.
bool FloorQuotientIsZero(int64_t a, int64_t b) { return b > 0 ? 0 <= a && a < b : b < a && a <= 0; }

struct LayoutWire {
  layout::Contract contract;
  std::string canonical;   // in the wire's own form
  std::string comparable;  // in the 2026-09 form, when that form can carry it
};

// §2.1 step 1, §12.3 step 2: an ASCII string that parses as a contract of either form, and its
// canonical forms.
absl::StatusOr<LayoutWire> ReadLayoutWire(absl::string_view wire) {
  for (size_t i = 0; i < wire.size(); ++i) {
    if (static_cast<unsigned char>(wire[i]) >= 0x80) {
      return Raises("cache_layout", absl::StrCat("must be ASCII, byte ", i,
                                                 " is not (CachePD bootstrap layout "
                                                 "is invalid)"));
    }
  }
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(wire);
  if (!contract.ok()) {
    return Raises("cache_layout",
                  absl::StrCat("is not a valid contract: ", contract.status().message()));
  }
  absl::StatusOr<std::string> canonical = layout::SerializeContract(*contract, contract->revision);
  if (!canonical.ok()) {
    return Raises("cache_layout",
                  absl::StrCat("does not re-serialise: ", canonical.status().message()));
  }
  // A snapshot contract the 2026-09 form cannot carry (§12.1's stricter group-spec checks) has
  // no 2026-09 twin to agree with, so its own canonical wire serves as the comparable one.
  absl::StatusOr<std::string> comparable =
      layout::SerializeContract(*contract, layout::Revision::k2026_09);
  return LayoutWire{*std::move(contract), *canonical, comparable.ok() ? *comparable : *canonical};
}

absl::Status ReadLayout(const json& body, ParsedRegistration& out) {
  const json* layout = Find(body, "cache_layout");
  if (layout == nullptr || !layout->is_string()) {
    return Raises("cache_layout", "must be a string (CachePD bootstrap layout must be a string)");
  }
  KVRAIL_ASSIGN_OR_RETURN(LayoutWire read, ReadLayoutWire(layout->get_ref<const std::string&>()));
  out.registration.contract = std::move(read.contract);
  out.canonical_layout = std::move(read.canonical);
  out.comparable_layout = std::move(read.comparable);
  return absl::OkStatus();
}

// A server pinned to one revision refuses a contract in the other's form (§12.11), as a
// reference server of that revision does: 500.
absl::Status CheckPinnedForm(layout::Revision form, std::optional<layout::Revision> pinned) {
  if (!pinned.has_value() || *pinned == form) return absl::OkStatus();
  const std::string mismatch =
      absl::StrCat("the contract is in the ", layout::RevisionName(form),
                   " form, and this bootstrap server is pinned to CachePD revision ",
                   layout::RevisionName(*pinned), " (--cachepd-revision), whose ");
  if (*pinned == layout::Revision::k2026_09) {
    return Refuse(Refusal::kReferenceRaises,
                  absl::StrCat("registration cache_layout: revision mismatch: ", mismatch,
                               "contracts require replayable in every group spec (CachePD "
                               "bootstrap layout is invalid; CACHEPD §12.1, §12.11)"));
  }
  return Refuse(Refusal::kReferenceRaises,
                absl::StrCat("registration cache_layout: revision mismatch: ", mismatch,
                             "contracts have no replayable or shard_count (unknown members; "
                             "CACHEPD §4.3, §12.11)"));
}

// Why the stage placement is required of this registration, or "" when it is optional.
std::string PlacementRequiredBecause(layout::Revision form,
                                     std::optional<layout::Revision> pinned) {
  if (pinned == layout::Revision::k2026_09) {
    return "revision mismatch: a registration without pp_size and cache_fields_by_stage is "
           "snapshot-era, and this bootstrap server is pinned to CachePD revision 2026-09 "
           "(--cachepd-revision), which requires both (CACHEPD §12.3, §12.11)";
  }
  if (form == layout::Revision::k2026_09) {
    return "a registration whose contract is in the 2026-09 form carries its stage placement";
  }
  return "";
}

absl::Status ReadPlacement(const json& body, std::optional<layout::Revision> pinned,
                           PrefillRegistration& out) {
  const std::string required = PlacementRequiredBecause(out.contract.revision, pinned);
  KVRAIL_ASSIGN_OR_RETURN(out.pipeline, ReadStagePlacement(body, out.contract, required));
  if (pinned == layout::Revision::kSnapshot && out.pipeline.has_value() &&
      out.pipeline->pp_size > 1) {
    return BadRequest("pp_size",
                      absl::StrCat(out.pipeline->pp_size,
                                   " stages, and this bootstrap server is pinned to CachePD "
                                   "revision snapshot (--cachepd-revision), whose sync answer "
                                   "cannot describe stages"),
                      "CACHEPD §2.2, §12.4");
  }
  return absl::OkStatus();
}

}  // namespace

bool operator==(const RankEndpoint& a, const RankEndpoint& b) {
  return a.rank_ip == b.rank_ip && a.rank_port == b.rank_port &&
         a.curve_public_key == b.curve_public_key;
}

absl::StatusOr<ParsedRegistration> ParseRegistration(absl::string_view text,
                                                     std::optional<layout::Revision> pinned) {
  if (NestingDepth(text) > kMaxBodyDepth) {
    return Raises("body", absl::StrCat("nests deeper than ", kMaxBodyDepth, " levels"));
  }
  const json body = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Raises("body", "is not valid JSON");
  if (!body.is_object()) return Raises("body", "must be a JSON object");

  // 1. What the reference reads before anything else (§11 item 4); each failure raises.
  ParsedRegistration parsed;
  PrefillRegistration& out = parsed.registration;
  KVRAIL_ASSIGN_OR_RETURN(const json* role, Required(body, "role"));
  KVRAIL_ASSIGN_OR_RETURN(int64_t world_size, ReadSize(body, "world_size"));
  KVRAIL_ASSIGN_OR_RETURN(int64_t dp_size, ReadSize(body, "dp_size"));
  KVRAIL_ASSIGN_OR_RETURN(const json* rank_ip, Required(body, "rank_ip"));
  KVRAIL_ASSIGN_OR_RETURN(int64_t rank_port, ReadPythonInt(body, "rank_port"));
  KVRAIL_ASSIGN_OR_RETURN(int64_t engine_rank, ReadPythonInt(body, "engine_rank"));
  // 2. The layout check, for every role (§2.1 step 1, §12.3 step 2).
  KVRAIL_RETURN_IF_ERROR(ReadLayout(body, parsed));
  KVRAIL_RETURN_IF_ERROR(CheckPinnedForm(out.contract.revision, pinned));
  // 3 to 5. The stage placement (§12.3).
  KVRAIL_RETURN_IF_ERROR(ReadPlacement(body, pinned, out));
  // 3. world_size // dp_size, and for a prefill engine_rank // that: a zero divisor raises.
  const bool prefill = role->is_string() && role->get_ref<const std::string&>() == kPrefillRole;
  if (dp_size == 0) return Raises("dp_size", "is 0, and world_size // dp_size divides by it");
  if (prefill && FloorQuotientIsZero(world_size, dp_size)) {
    return Raises("world_size", absl::StrCat("// dp_size is 0 (", world_size, " // ", dp_size,
                                             "), and engine_rank is divided by it"));
  }
  out.role = role->is_string() ? role->get<std::string>() : role->dump();

  // kvrail's own rules: the reference accepts these requests only because it never checks.
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return BadRequest("world_size", absl::StrCat(world_size, " is outside 1..", kMaxWorldSize));
  }
  if (dp_size < 1 || dp_size > world_size) {
    return BadRequest("dp_size",
                      absl::StrCat(dp_size, " is outside 1..world_size (", world_size, ")"));
  }
  out.world_size = static_cast<int>(world_size);
  out.dp_size = static_cast<int>(dp_size);
  if (!rank_ip->is_string() || rank_ip->get_ref<const std::string&>().empty()) {
    return BadRequest("rank_ip", absl::StrCat("must be a non-empty string, got ", Quote(*rank_ip)));
  }
  for (unsigned char c : rank_ip->get_ref<const std::string&>()) {
    if (c <= 0x20 || c >= 0x7F) {
      return BadRequest("rank_ip",
                        absl::StrCat(Quote(*rank_ip), " must be printable ASCII without spaces"));
    }
  }
  out.endpoint.rank_ip = rank_ip->get<std::string>();
  if (rank_port < 1 || rank_port > 65535) {
    return BadRequest("rank_port", absl::StrCat(rank_port, " is outside 1..65535"));
  }
  out.endpoint.rank_port = static_cast<int>(rank_port);
  if (prefill && (engine_rank < 0 || engine_rank >= world_size)) {
    return BadRequest("engine_rank", absl::StrCat(engine_rank, " is outside 0..world_size-1 (",
                                                  world_size - 1, ")"));
  }
  out.engine_rank = static_cast<int>(std::clamp<int64_t>(engine_rank, -1, kMaxWorldSize));

  absl::StatusOr<int> stage_tp = plan::StageTpSize(out.world_size, out.dp_size, out.PpSize());
  if (!stage_tp.ok()) {
    return BadRequest(
        "world_size",
        absl::StrCat(world_size, " must be a multiple of dp_size (", dp_size, ") * pp_size (",
                     out.PpSize(), "): ", stage_tp.status().message()),
        "CACHEPD §2.1, §12.3");
  }
  if (const json* key = Find(body, "curve_public_key"); key != nullptr) {
    if (!key->is_string() ||
        !zmq_auth::CheckZ85Key(key->get_ref<const std::string&>(), "curve_public_key").ok()) {
      return BadRequest("curve_public_key", "must be a 32-byte CURVE key in Z85 (40 characters)",
                        "docs/SECURITY.md");
    }
    out.endpoint.curve_public_key = key->get<std::string>();
  }
  return parsed;
}

absl::StatusOr<std::string> CanonicalLayout(absl::string_view wire) {
  KVRAIL_ASSIGN_OR_RETURN(LayoutWire read, ReadLayoutWire(wire));
  return std::move(read.comparable);
}

absl::StatusOr<std::string> SerializeRegistration(const PrefillRegistration& registration) {
  const layout::Revision form = registration.contract.revision;
  KVRAIL_ASSIGN_OR_RETURN(std::string wire, layout::SerializeContract(registration.contract, form));
  const plan::PipelineLayout placement =
      registration.pipeline.value_or(plan::PipelineLayout::SingleStage(registration.contract));
  nlohmann::ordered_json body;
  body["role"] = registration.role;
  body["world_size"] = registration.world_size;
  body["dp_size"] = registration.dp_size;
  if (form == layout::Revision::k2026_09) {  // §12.3: always, before the endpoint
    body["pp_size"] = placement.pp_size;
    body["cache_fields_by_stage"] = placement.fields_by_stage;
  }
  body["rank_ip"] = registration.endpoint.rank_ip;
  body["rank_port"] = registration.endpoint.rank_port;
  body["engine_rank"] = registration.engine_rank;
  body["cache_layout"] = std::move(wire);
  if (form == layout::Revision::kSnapshot && registration.pipeline.has_value()) {
    body["pp_size"] = placement.pp_size;  // kvrail's snapshot-era pipelined prefills
    body["cache_fields_by_stage"] = placement.fields_by_stage;
  }
  if (!registration.endpoint.curve_public_key.empty()) {
    body["curve_public_key"] = registration.endpoint.curve_public_key;
  }
  return DumpPythonJson(body);
}

}  // namespace kvrail::bootstrap
