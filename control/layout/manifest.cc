#include "control/layout/manifest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/layout/json_fields.h"
#include "control/layout/json_text.h"
#include "engine/base/error.h"

namespace kvrail::layout {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

absl::Status ManifestError(absl::string_view problem, absl::string_view section) {
  return MakeError(ErrorCategory::kInvalidManifest,
                   absl::StrCat("manifest ", problem, " (", section, ")"));
}

// Python floor division, for the slot rules of §5.2.
int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }

}  // namespace

SlotRange LogicalSlots(const GroupSpec& spec, int64_t prefix_len, int64_t prompt_len) {
  const int64_t g = spec.block_granularity();
  if (spec.transfer_policy != TransferPolicy::kFullSuffix) {
    int64_t slot = FloorDiv(prompt_len - 1, g);
    return {slot, slot + 1};
  }
  int64_t begin = FloorDiv(prefix_len, g);
  if (spec.retention == Retention::kSlidingWindow && spec.sliding_window_tokens.has_value()) {
    int64_t tail = std::max<int64_t>(0, prompt_len - *spec.sliding_window_tokens + 1);
    begin = std::max(begin, FloorDiv(tail, g));
  }
  return {begin, std::max(begin, CeilDiv(prompt_len, g))};
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view wire) {
  constexpr absl::string_view kSection = "CACHEPD §5.1";
  KVRAIL_ASSIGN_OR_RETURN(json root,
                          ParseStrictJson(wire, kMaxManifestBytes, ErrorCategory::kInvalidManifest,
                                          "manifest", kSection));
  KVRAIL_ASSIGN_OR_RETURN(JsonObject top,
                          JsonObject::Of(root, "", ErrorCategory::kInvalidManifest, kSection));
  Manifest manifest;
  KVRAIL_ASSIGN_OR_RETURN(const json* groups, top.Array("groups"));
  manifest.groups.reserve(groups->size());
  for (size_t i = 0; i < groups->size(); ++i) {
    KVRAIL_ASSIGN_OR_RETURN(JsonObject group,
                            JsonObject::Of((*groups)[i], IndexPath("groups", i),
                                           ErrorCategory::kInvalidManifest, kSection));
    ManifestGroup entry;
    KVRAIL_ASSIGN_OR_RETURN(entry.group_id, group.String("group_id"));
    KVRAIL_ASSIGN_OR_RETURN(entry.block_ids, group.IntArray("block_ids", 0, kInt64Max));
    manifest.groups.push_back(std::move(entry));
  }
  KVRAIL_ASSIGN_OR_RETURN(manifest.prefix_len, top.Int("prefix_len", 0, kMaxTokens));
  KVRAIL_ASSIGN_OR_RETURN(manifest.prompt_len, top.Int("prompt_len", 0, kMaxTokens));
  return manifest;
}

namespace {

// Appends `text` as a canonical JSON string. Printable ASCII other than '"' and '\\' is written
// as itself (what DumpCanonical writes for it); anything else goes through DumpCanonical.
absl::Status AppendCanonicalString(const std::string& text, std::string& wire) {
  const bool plain = std::all_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u <= 0x7E && c != '"' && c != '\\';
  });
  if (plain) {
    absl::StrAppend(&wire, "\"", text, "\"");
    return absl::OkStatus();
  }
  KVRAIL_ASSIGN_OR_RETURN(
      std::string quoted,
      DumpCanonical(ordered_json(text), ErrorCategory::kInvalidManifest, "manifest group_id"));
  wire += quoted;
  return absl::OkStatus();
}

}  // namespace

// Written directly rather than built as an ordered_json and dumped: the same bytes (the
// reference vectors and ManifestTest.SerializedBytesAreTheDomDump check), without a DOM node
// and its allocations per block id; a decode serialises the manifest of every room it
// pre-allocates (kvrail bench control).
absl::StatusOr<std::string> SerializeManifest(const Manifest& manifest) {
  std::string wire = "{\"groups\":[";
  for (size_t i = 0; i < manifest.groups.size(); ++i) {
    const ManifestGroup& g = manifest.groups[i];
    if (i > 0) wire += ',';
    wire += "{\"group_id\":";
    KVRAIL_RETURN_IF_ERROR(AppendCanonicalString(g.group_id, wire));
    wire += ",\"block_ids\":[";
    for (size_t j = 0; j < g.block_ids.size(); ++j) {
      if (j > 0) wire += ',';
      absl::StrAppend(&wire, g.block_ids[j]);
    }
    wire += "]}";
  }
  absl::StrAppend(&wire, "],\"prefix_len\":", manifest.prefix_len,
                  ",\"prompt_len\":", manifest.prompt_len, "}");
  if (wire.size() > kMaxManifestBytes) {
    return ManifestError(
        absl::StrCat("canonical wire of ", wire.size(), " bytes exceeds ", kMaxManifestBytes),
        "CACHEPD §5.1");
  }
  return wire;
}

absl::Status ValidateManifest(const Manifest& manifest, const Contract& contract) {
  constexpr absl::string_view kSection = "CACHEPD §5.3";
  if (!(manifest.prefix_len < manifest.prompt_len)) {
    return ManifestError(absl::StrCat("requires prefix_len < prompt_len, got ", manifest.prefix_len,
                                      " and ", manifest.prompt_len),
                         kSection);
  }
  if (manifest.prefix_len < 0 || manifest.prompt_len > kMaxTokens) {
    return ManifestError("prompt window is out of range", kSection);
  }
  std::vector<absl::string_view> want, got;
  for (const GroupSpec& spec : contract.group_specs) want.push_back(spec.group_id);
  for (const ManifestGroup& group : manifest.groups) got.push_back(group.group_id);
  if (want != got) {
    return ManifestError(
        absl::StrCat("group order [", absl::StrJoin(got, ","), "] disagrees with the contract's [",
                     absl::StrJoin(want, ","), "]"),
        kSection);
  }
  if (manifest.prefix_len % contract.plan.prefix_granularity != 0) {
    return ManifestError(
        absl::StrCat("prefix_len ", manifest.prefix_len,
                     " is not a multiple of prefix_granularity ", contract.plan.prefix_granularity),
        kSection);
  }
  for (size_t i = 0; i < manifest.groups.size(); ++i) {
    const ManifestGroup& group = manifest.groups[i];
    const GroupSpec& spec = contract.group_specs[i];
    SlotRange slots = LogicalSlots(spec, manifest.prefix_len, manifest.prompt_len);
    if (static_cast<int64_t>(group.block_ids.size()) != slots.size()) {
      return ManifestError(
          absl::StrCat("group '", group.group_id, "' carries ", group.block_ids.size(),
                       " blocks but its transfer policy needs ", slots.size(), " (slots ",
                       slots.begin, "..", slots.end, ")"),
          kSection);
    }
    // Ids are virtual block ids: below 1 + (page_count - 1) * shard_count (§12.2), which is
    // page_count for an unsharded group (§5.3).
    const int64_t bound = contract.VirtualBlockCount(group.group_id);
    for (size_t j = 0; j < group.block_ids.size(); ++j) {
      int64_t id = group.block_ids[j];
      if (id <= 0 || id >= bound) {
        return ManifestError(
            absl::StrCat("groups[", i, "].block_ids[", j, "]: block ", id, " of group '",
                         group.group_id, "' is outside 1..", bound - 1),
            "CACHEPD §5.3, §12.2");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Manifest> BuildManifest(const Contract& contract,
                                       absl::Span<const std::vector<int64_t>> block_tables,
                                       int64_t prefix_len, int64_t prompt_len) {
  constexpr absl::string_view kSection = "CACHEPD §5.2";
  if (block_tables.size() != contract.group_specs.size()) {
    return ManifestError(absl::StrCat("needs one block table per group (",
                                      contract.group_specs.size(), "), got ", block_tables.size()),
                         kSection);
  }
  if (prefix_len < 0 || prompt_len > kMaxTokens || prefix_len >= prompt_len) {
    return ManifestError(absl::StrCat("requires 0 <= prefix_len < prompt_len, got ", prefix_len,
                                      " and ", prompt_len),
                         kSection);
  }
  if (prefix_len % contract.plan.prefix_granularity != 0) {
    return ManifestError(
        absl::StrCat("prefix_len ", prefix_len, " must be aligned to prefix_granularity ",
                     contract.plan.prefix_granularity),
        kSection);
  }
  Manifest manifest;
  manifest.prefix_len = prefix_len;
  manifest.prompt_len = prompt_len;
  for (size_t i = 0; i < contract.group_specs.size(); ++i) {
    const GroupSpec& spec = contract.group_specs[i];
    const int64_t bound = contract.VirtualBlockCount(spec.group_id);  // §12.2
    SlotRange slots = LogicalSlots(spec, prefix_len, prompt_len);
    ManifestGroup group{spec.group_id, {}};
    for (int64_t slot = slots.begin; slot < slots.end; ++slot) {
      if (slot < 0 || slot >= static_cast<int64_t>(block_tables[i].size())) {
        return ManifestError(
            absl::StrCat("group '", spec.group_id, "' needs slot ", slot,
                         " but its block table has ", block_tables[i].size(), " slots"),
            kSection);
      }
      int64_t id = block_tables[i][slot];
      if (id <= 0 || id >= bound) {
        return ManifestError(absl::StrCat("group '", spec.group_id, "' slot ", slot,
                                          " holds block ", id, ", outside 1..", bound - 1),
                             "CACHEPD §5.2, §12.2");
      }
      group.block_ids.push_back(id);
    }
    manifest.groups.push_back(std::move(group));
  }
  return manifest;
}

}  // namespace kvrail::layout
