#include "control/layout/contract.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
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

constexpr absl::string_view kParseSection = "CACHEPD §4.3";
constexpr absl::string_view kCheckSection = "CACHEPD §4.4";
constexpr absl::string_view kRevisionSection = "CACHEPD §12.1";

absl::Status ContractError(absl::string_view path, absl::string_view problem,
                           absl::string_view section = kCheckSection) {
  return MakeError(ErrorCategory::kInvalidContract,
                   absl::StrCat("contract ", path, ": ", problem, " (", section, ")"));
}

absl::Status PeerError(absl::string_view problem, absl::string_view section = "CACHEPD §4.5") {
  return MakeError(ErrorCategory::kIncompatiblePeer,
                   absl::StrCat("prefill/decode contract mismatch: ", problem, " (", section, ")"));
}

// Reads one of `names` from `obj[key]` into the enum value at the same index.
template <typename Enum, size_t N>
absl::StatusOr<Enum> ReadEnum(const JsonObject& obj, absl::string_view key,
                              const std::array<std::pair<Enum, absl::string_view>, N>& names,
                              std::optional<Enum> default_value) {
  KVRAIL_ASSIGN_OR_RETURN(std::optional<std::string> text, obj.OptionalString(key));
  if (!text.has_value()) {
    if (default_value.has_value() && !obj.Has(key)) return *default_value;
    std::vector<std::string> quoted;
    quoted.reserve(names.size());
    for (const auto& [value, name] : names) quoted.push_back(absl::StrCat("\"", name, "\""));
    return obj.MemberError(
        key, absl::StrCat("must be one of ", absl::StrJoin(quoted, ", "),
                          "; kvrail rejects a missing or null value that the reference would "
                          "leave unchecked"));
  }
  for (const auto& [value, name] : names) {
    if (name == *text) return value;
  }
  std::vector<std::string> quoted;
  quoted.reserve(names.size());
  for (const auto& [value, name] : names) quoted.push_back(absl::StrCat("\"", name, "\""));
  return obj.MemberError(
      key, absl::StrCat("\"", *text, "\" is not one of ", absl::StrJoin(quoted, ", ")));
}

constexpr std::array<std::pair<Retention, absl::string_view>, 2> kRetentions = {{
    {Retention::kFullHistory, "full_history"},
    {Retention::kSlidingWindow, "sliding_window"},
}};
constexpr std::array<std::pair<TransferPolicy, absl::string_view>, 2> kPolicies = {{
    {TransferPolicy::kFullSuffix, "full_suffix"},
    {TransferPolicy::kLatestSnapshot, "latest_snapshot"},
}};

template <typename Enum, size_t N>
absl::string_view EnumName(Enum value,
                           const std::array<std::pair<Enum, absl::string_view>, N>& names) {
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return "";
}

absl::StatusOr<GroupLayout> ReadGroupLayout(const json& value, const std::string& path) {
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject obj, JsonObject::Of(value, path, ErrorCategory::kInvalidContract, kParseSection));
  KVRAIL_RETURN_IF_ERROR(obj.OnlyMembers({"group_id", "cache_blocks_per_lcm_block", "page_count"}));
  GroupLayout group;
  KVRAIL_ASSIGN_OR_RETURN(group.group_id, obj.String("group_id"));
  KVRAIL_ASSIGN_OR_RETURN(group.cache_blocks_per_lcm_block,
                          obj.Int("cache_blocks_per_lcm_block", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(group.page_count, obj.Int("page_count", 1, kMaxContractInteger));
  return group;
}

absl::StatusOr<PlaneLayout> ReadPlaneLayout(const json& value, const std::string& path) {
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject obj, JsonObject::Of(value, path, ErrorCategory::kInvalidContract, kParseSection));
  KVRAIL_RETURN_IF_ERROR(
      obj.OnlyMembers({"plane_id", "bytes_per_lcm_block", "arena_offset_bytes"}));
  PlaneLayout plane;
  KVRAIL_ASSIGN_OR_RETURN(plane.plane_id, obj.String("plane_id"));
  KVRAIL_ASSIGN_OR_RETURN(plane.bytes_per_lcm_block,
                          obj.Int("bytes_per_lcm_block", 0, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(plane.arena_offset_bytes,
                          obj.Int("arena_offset_bytes", 0, kMaxContractInteger));
  return plane;
}

absl::StatusOr<FieldLayout> ReadFieldLayout(const json& value, const std::string& path) {
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject obj, JsonObject::Of(value, path, ErrorCategory::kInvalidContract, kParseSection));
  KVRAIL_RETURN_IF_ERROR(obj.OnlyMembers({"group_id", "field_id", "plane_id", "shape", "dtype",
                                          "field_offset_bytes", "page_stride_bytes"}));
  FieldLayout field;
  KVRAIL_ASSIGN_OR_RETURN(field.group_id, obj.String("group_id"));
  KVRAIL_ASSIGN_OR_RETURN(field.field_id, obj.String("field_id"));
  KVRAIL_ASSIGN_OR_RETURN(field.plane_id, obj.String("plane_id"));
  // Extents of at least 1: a zero extent makes the reference divide by zero (§4.3 item 7).
  KVRAIL_ASSIGN_OR_RETURN(field.shape, obj.IntArray("shape", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(std::string dtype, obj.String("dtype"));
  std::optional<DType> parsed = DTypeFromName(dtype);
  if (!parsed.has_value()) {
    return obj.MemberError(
        "dtype", absl::StrCat("\"", dtype, "\" is not a dtype of the table (CACHEPD §4.7)"));
  }
  field.dtype = *parsed;
  KVRAIL_ASSIGN_OR_RETURN(field.field_offset_bytes,
                          obj.Int("field_offset_bytes", 0, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(field.page_stride_bytes,
                          obj.Int("page_stride_bytes", 1, kMaxContractInteger));
  return field;
}

// A group spec as the wire carried it: which of 2026-09's members it had decides the form.
struct WireGroupSpec {
  GroupSpec spec;
  bool has_replayable = false;
  bool has_shard_count = false;
};

absl::StatusOr<WireGroupSpec> ReadGroupSpec(const json& value, const std::string& path) {
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject obj, JsonObject::Of(value, path, ErrorCategory::kInvalidContract, kParseSection));
  // Both revisions' members (§4.1, §12.1); anything else is refused in either form (§4.3 item 4).
  KVRAIL_RETURN_IF_ERROR(obj.OnlyMembers(
      {"group_id", "retention", "rows_per_page", "entry_stride_tokens", "sliding_window_tokens",
       "replayable", "family", "transfer_policy", "checkpoint_granularity", "shard_count"}));
  WireGroupSpec wire;
  GroupSpec& spec = wire.spec;
  KVRAIL_ASSIGN_OR_RETURN(spec.group_id, obj.String("group_id"));
  if (!obj.Has("retention")) return obj.MemberError("retention", "required member is missing");
  KVRAIL_ASSIGN_OR_RETURN(spec.retention,
                          ReadEnum<Retention>(obj, "retention", kRetentions, std::nullopt));
  KVRAIL_ASSIGN_OR_RETURN(spec.rows_per_page,
                          obj.OptionalInt("rows_per_page", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(spec.entry_stride_tokens,
                          obj.OptionalInt("entry_stride_tokens", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(spec.sliding_window_tokens,
                          obj.OptionalInt("sliding_window_tokens", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(std::optional<std::string> family, obj.OptionalString("family"));
  if (family.has_value()) {
    spec.family = *std::move(family);
  } else if (obj.Has("family")) {
    return obj.MemberError("family", "must be a string such as \"history\" or \"state\"");
  }
  KVRAIL_ASSIGN_OR_RETURN(spec.transfer_policy, ReadEnum<TransferPolicy>(obj, "transfer_policy",
                                                                         kPolicies, std::nullopt));
  KVRAIL_ASSIGN_OR_RETURN(spec.checkpoint_granularity,
                          obj.OptionalInt("checkpoint_granularity", 1, kMaxContractInteger));
  // 2026-09's members (§12.1), with errors citing that section. replayable is a JSON bool (the
  // reference would take null or 0 and write them back; no newer peer emits them). shard_count
  // is an integer, not a bool or float or string; its sign is checked with the other §12.1
  // rules in ValidateGroupSpec, null is refused (the reference's check fails on it too).
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject revised,
      JsonObject::Of(value, path, ErrorCategory::kInvalidContract, kRevisionSection));
  wire.has_replayable = revised.Has("replayable");
  if (wire.has_replayable) {
    KVRAIL_ASSIGN_OR_RETURN(spec.replayable, revised.Bool("replayable"));
  }
  wire.has_shard_count = revised.Has("shard_count");
  if (wire.has_shard_count) {
    KVRAIL_ASSIGN_OR_RETURN(
        spec.shard_count,
        revised.Int("shard_count", std::numeric_limits<int64_t>::min(), kMaxContractInteger));
  }
  return wire;
}

// The form of a contract wire (§12.1), from its group specs, then its plan.
absl::StatusOr<Revision> WireForm(const std::vector<WireGroupSpec>& specs,
                                  bool plan_has_resident_block_bytes) {
  const auto with_replayable =
      std::find_if(specs.begin(), specs.end(), [](const auto& s) { return s.has_replayable; });
  if (with_replayable == specs.end()) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].has_shard_count) {
        return ContractError(
            absl::StrCat("group_specs[", i, "].replayable"),
            absl::StrCat("group '", specs[i].spec.group_id,
                         "' has shard_count but no replayable; a 2026-09 group spec carries both "
                         "(replayable is required), a snapshot one neither"),
            kRevisionSection);
      }
    }
    // No group spec says: a plan member only 2026-09 writes does (an empty contract).
    return specs.empty() && plan_has_resident_block_bytes ? Revision::k2026_09
                                                          : Revision::kSnapshot;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].has_replayable) {
      return ContractError(
          absl::StrCat("group_specs[", i, "].replayable"),
          absl::StrCat("required member is missing from group '", specs[i].spec.group_id,
                       "': group_specs[", with_replayable - specs.begin(),
                       "] has replayable, so the wire is in the 2026-09 form, where every group "
                       "spec carries it"),
          kRevisionSection);
    }
  }
  return Revision::k2026_09;
}

absl::StatusOr<SchemaField> ReadSchemaField(const json& value, const std::string& path) {
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject obj, JsonObject::Of(value, path, ErrorCategory::kInvalidContract, kParseSection));
  SchemaField entry;
  KVRAIL_ASSIGN_OR_RETURN(entry.field_id, obj.String("field_id"));
  KVRAIL_ASSIGN_OR_RETURN(JsonObject partition, obj.Object("partition"));
  // The axis is range-checked against the field's shape in ValidateContract.
  KVRAIL_ASSIGN_OR_RETURN(entry.partition.axis, partition.Int("axis", 0, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(entry.partition.global_extent,
                          partition.Int("global_extent", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(entry.partition.global_parts,
                          partition.IntArray("global_parts", 1, kMaxContractInteger));
  return entry;
}

template <typename T>
using Reader = absl::StatusOr<T> (*)(const json&, const std::string&);

template <typename T>
absl::StatusOr<std::vector<T>> ReadRecords(const JsonObject& parent, absl::string_view key,
                                           Reader<T> read) {
  KVRAIL_ASSIGN_OR_RETURN(const json* array, parent.Array(key));
  std::vector<T> out;
  out.reserve(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    KVRAIL_ASSIGN_OR_RETURN(T record, read((*array)[i], IndexPath(parent.PathOf(key), i)));
    out.push_back(std::move(record));
  }
  return out;
}

// Multiplies with an overflow check against kMaxContractInteger.
bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out) && *out <= kMaxContractInteger;
}

absl::Status ValidatePartition(const Contract& contract, const SchemaField& entry,
                               const std::string& path) {
  const FieldLayout* field = contract.FindField(entry.field_id);
  const Partition& p = entry.partition;
  if (p.axis < 0 || p.axis >= static_cast<int64_t>(field->shape.size())) {
    return ContractError(absl::StrCat(path, ".partition.axis"),
                         absl::StrCat("axis ", p.axis, " is outside the shape of field '",
                                      field->field_id, "' (rank ", field->shape.size(), ")"));
  }
  const int64_t local = field->shape[p.axis];
  if (p.global_extent < local || p.global_extent % local != 0) {
    return ContractError(
        absl::StrCat(path, ".partition.global_extent"),
        absl::StrCat("global extent ", p.global_extent, " must be a multiple of the local extent ",
                     local, " of field '", field->field_id, "' on axis ", p.axis));
  }
  if (p.global_parts.empty()) return absl::OkStatus();
  const int64_t shards = p.global_extent / local;
  if (p.global_parts.size() < 2 || p.global_parts.size() > kMaxGlobalParts) {
    return ContractError(absl::StrCat(path, ".partition.global_parts"),
                         absl::StrCat("must be empty or hold 2..", kMaxGlobalParts, " parts, got ",
                                      p.global_parts.size()));
  }
  int64_t sum = 0;
  for (size_t i = 0; i < p.global_parts.size(); ++i) {
    if (p.global_parts[i] % shards != 0) {
      return ContractError(absl::StrCat(path, ".partition.global_parts[", i, "]"),
                           absl::StrCat("part ", p.global_parts[i],
                                        " is not divisible by the distinct-shard count ", shards));
    }
    sum += p.global_parts[i];
  }
  if (sum != p.global_extent) {
    return ContractError(
        absl::StrCat(path, ".partition.global_parts"),
        absl::StrCat("parts sum to ", sum, ", not to the global extent ", p.global_extent));
  }
  return absl::OkStatus();
}

// The geometry rules §12.1 adds to §4.4: checkpoint geometry only with full_history retention,
// and a state family only with checkpoint geometry.
absl::Status CheckRevisedGeometry(const GroupSpec& spec, const std::string& path) {
  if (spec.checkpoint_granularity.has_value() && spec.retention != Retention::kFullHistory) {
    return ContractError(absl::StrCat(path, ".retention"),
                         absl::StrCat("group '", spec.group_id,
                                      "': checkpoint geometry keeps checkpoints that never "
                                      "slide out; declare full_history retention"),
                         kRevisionSection);
  }
  if (!spec.checkpoint_granularity.has_value() && spec.family == "state") {
    return ContractError(absl::StrCat(path, ".family"),
                         absl::StrCat("group '", spec.group_id,
                                      "': a state-family group must use checkpoint geometry"),
                         kRevisionSection);
  }
  return absl::OkStatus();
}

// The group-spec checks of `form`, in its reference's order: §4.4 for the snapshot; for 2026-09
// §12.1's (shard_count, then checkpoint geometry and full_history, or a non-state family with
// row geometry and replayable only on a sliding window). The rules on the members 2026-09 adds
// hold in both forms: a snapshot wire always passes them (replayable false, shard_count 1).
absl::Status ValidateGroupSpec(const GroupSpec& spec, Revision form, const std::string& path) {
  if (spec.shard_count < 1) {
    return ContractError(absl::StrCat(path, ".shard_count"),
                         absl::StrCat("group '", spec.group_id, "': shard_count must be >= 1, got ",
                                      spec.shard_count),
                         kRevisionSection);
  }
  const bool revised = form == Revision::k2026_09;
  if (spec.checkpoint_granularity.has_value()) {
    if (spec.rows_per_page.has_value() || spec.entry_stride_tokens.has_value()) {
      return ContractError(path, absl::StrCat("group '", spec.group_id,
                                              "' declares both row and checkpoint geometry"));
    }
    if (spec.family != "state") {
      return ContractError(path, absl::StrCat("group '", spec.group_id,
                                              "': checkpoint_granularity is only valid for "
                                              "state-family groups"));
    }
    if (*spec.checkpoint_granularity <= 0) {
      return ContractError(path, "checkpoint_granularity must be > 0");
    }
    if (revised) KVRAIL_RETURN_IF_ERROR(CheckRevisedGeometry(spec, path));
  } else {
    if (revised) KVRAIL_RETURN_IF_ERROR(CheckRevisedGeometry(spec, path));
    if (!spec.rows_per_page.has_value() || !spec.entry_stride_tokens.has_value()) {
      return ContractError(path, absl::StrCat("group '", spec.group_id,
                                              "': declare either row geometry (rows_per_page + "
                                              "entry_stride_tokens) or checkpoint_granularity"));
    }
    int64_t granularity;
    if (!CheckedMul(*spec.rows_per_page, *spec.entry_stride_tokens, &granularity)) {
      return ContractError(path, "rows_per_page * entry_stride_tokens is too large");
    }
  }
  if (spec.replayable && spec.retention != Retention::kSlidingWindow) {
    return ContractError(absl::StrCat(path, ".replayable"),
                         absl::StrCat("group '", spec.group_id,
                                      "': only a sliding_window group can be replayable (a "
                                      "full-history group is prefix-closed and shared)"),
                         kRevisionSection);
  }
  if (spec.retention == Retention::kSlidingWindow && !spec.sliding_window_tokens.has_value()) {
    return ContractError(path, absl::StrCat("group '", spec.group_id,
                                            "' has sliding_window retention but no "
                                            "sliding_window_tokens (kvrail strict rule)"));
  }
  return absl::OkStatus();
}

// Rejects repeated ids among `records` (kvrail strict rule; the reference leaves it unchecked
// and later resolves the id to whichever record a dict kept).
template <typename T, typename GetId>
absl::Status RequireUniqueIds(const std::vector<T>& records, absl::string_view path,
                              absl::string_view member, GetId get_id) {
  std::set<std::string> seen;
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string& id = get_id(records[i]);
    if (!seen.insert(id).second) {
      return ContractError(absl::StrCat(path, "[", i, "].", member),
                           absl::StrCat("id '", id, "' is repeated (kvrail strict rule)"));
    }
  }
  return absl::OkStatus();
}

ordered_json OptionalToJson(const std::optional<int64_t>& value) {
  return value.has_value() ? ordered_json(*value) : ordered_json(nullptr);
}

}  // namespace

absl::string_view RetentionName(Retention retention) { return EnumName(retention, kRetentions); }
absl::string_view TransferPolicyName(TransferPolicy policy) { return EnumName(policy, kPolicies); }

int64_t GroupSpec::block_granularity() const {
  if (checkpoint_granularity.has_value()) return *checkpoint_granularity;
  return rows_per_page.value_or(1) * entry_stride_tokens.value_or(1);
}

bool operator==(const Partition& a, const Partition& b) {
  return a.axis == b.axis && a.global_extent == b.global_extent && a.global_parts == b.global_parts;
}

const GroupLayout* Contract::FindGroup(absl::string_view group_id) const {
  for (const GroupLayout& g : plan.groups) {
    if (g.group_id == group_id) return &g;
  }
  return nullptr;
}

const PlaneLayout* Contract::FindPlane(absl::string_view plane_id) const {
  for (const PlaneLayout& p : plan.planes) {
    if (p.plane_id == plane_id) return &p;
  }
  return nullptr;
}

const FieldLayout* Contract::FindField(absl::string_view field_id) const {
  for (const FieldLayout& f : plan.fields) {
    if (f.field_id == field_id) return &f;
  }
  return nullptr;
}

const GroupSpec* Contract::FindGroupSpec(absl::string_view group_id) const {
  for (const GroupSpec& s : group_specs) {
    if (s.group_id == group_id) return &s;
  }
  return nullptr;
}

const Partition* Contract::FindPartition(absl::string_view field_id) const {
  for (const SchemaField& entry : transfer_schema) {
    if (entry.field_id == field_id) return &entry.partition;
  }
  return nullptr;
}

std::vector<const FieldLayout*> Contract::FieldsOfGroup(absl::string_view group_id) const {
  std::vector<const FieldLayout*> out;
  for (const FieldLayout& f : plan.fields) {
    if (f.group_id == group_id) out.push_back(&f);
  }
  // std::string compares bytes as unsigned char: code-point order for UTF-8 text.
  std::sort(out.begin(), out.end(),
            [](const FieldLayout* a, const FieldLayout* b) { return a->field_id < b->field_id; });
  return out;
}

int64_t Contract::ArenaBytes() const {
  return (plan.num_lcm_blocks + 1) * plan.resident_block_bytes.value_or(plan.lcm_block_bytes);
}

int64_t Contract::VirtualBlockCount(absl::string_view group_id) const {
  const GroupLayout* group = FindGroup(group_id);
  return group == nullptr ? 0 : VirtualBlockCount(*group);
}

int64_t Contract::VirtualBlockCount(const GroupLayout& group) const {
  const GroupSpec* spec = FindGroupSpec(group.group_id);
  const int64_t shards = spec == nullptr ? 1 : spec->shard_count;
  return 1 + (group.page_count - 1) * shards;
}

int64_t PayloadBytes(const FieldLayout& field) {
  int64_t bytes = DTypeSize(field.dtype);
  for (int64_t extent : field.shape) bytes *= extent;
  return bytes;
}

std::vector<int64_t> GlobalShape(const FieldLayout& field, const Partition* partition) {
  std::vector<int64_t> shape = field.shape;
  if (partition != nullptr) shape[partition->axis] = partition->global_extent;
  return shape;
}

absl::StatusOr<int64_t> PageOffset(const Contract& contract, const FieldLayout& field,
                                   int64_t page) {
  const GroupLayout* group = contract.FindGroup(field.group_id);
  const PlaneLayout* plane = contract.FindPlane(field.plane_id);
  if (group == nullptr || plane == nullptr) {
    return ContractError(absl::StrCat("field '", field.field_id, "'"),
                         "names a group or plane the plan does not have", "CACHEPD §4.6");
  }
  if (page < 0 || page >= group->page_count) {
    return MakeError(ErrorCategory::kInvalidManifest,
                     absl::StrCat("page ", page, " of field '", field.field_id, "' is outside 0..",
                                  group->page_count - 1, " (CACHEPD §4.6)"));
  }
  // Every term is at most 2^52 and page * stride at most 2^104 in theory; compute in 128 bits.
  __int128 offset = static_cast<__int128>(plane->arena_offset_bytes) + plane->bytes_per_lcm_block -
                    field.page_stride_bytes +
                    static_cast<__int128>(page) * field.page_stride_bytes +
                    field.field_offset_bytes;
  if (offset < 0 || offset > kMaxContractInteger) {
    return ContractError(absl::StrCat("field '", field.field_id, "'"),
                         absl::StrCat("page ", page, " lies outside any addressable arena"),
                         "CACHEPD §4.6");
  }
  return static_cast<int64_t>(offset);
}

absl::StatusOr<Contract> ParseContract(absl::string_view wire) {
  KVRAIL_ASSIGN_OR_RETURN(json root,
                          ParseStrictJson(wire, kMaxContractBytes, ErrorCategory::kInvalidContract,
                                          "contract", kParseSection));
  KVRAIL_ASSIGN_OR_RETURN(JsonObject top,
                          JsonObject::Of(root, "", ErrorCategory::kInvalidContract, kParseSection));
  Contract contract;
  KVRAIL_ASSIGN_OR_RETURN(JsonObject plan, top.Object("plan"));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.prefix_granularity,
                          plan.Int("prefix_granularity", 1, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.lcm_block_bytes,
                          plan.Int("lcm_block_bytes", 0, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.num_lcm_blocks,
                          plan.Int("num_lcm_blocks", 0, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.groups, ReadRecords(plan, "groups", &ReadGroupLayout));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.planes, ReadRecords(plan, "planes", &ReadPlaneLayout));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.fields, ReadRecords(plan, "fields", &ReadFieldLayout));
  // Read in either form: the snapshot's reference ignores unknown plan members (§4.3 item 4),
  // so a value here does not make the wire 2026-09 when its group specs are the snapshot's.
  KVRAIL_ASSIGN_OR_RETURN(
      JsonObject revised_plan,
      JsonObject::Of(root.at("plan"), "plan", ErrorCategory::kInvalidContract, kRevisionSection));
  KVRAIL_ASSIGN_OR_RETURN(contract.plan.resident_block_bytes,
                          revised_plan.OptionalInt("resident_block_bytes", 0, kMaxContractInteger));
  KVRAIL_ASSIGN_OR_RETURN(std::vector<WireGroupSpec> specs,
                          ReadRecords(top, "group_specs", &ReadGroupSpec));
  KVRAIL_ASSIGN_OR_RETURN(contract.revision,
                          WireForm(specs, revised_plan.Has("resident_block_bytes")));
  contract.group_specs.reserve(specs.size());
  for (WireGroupSpec& spec : specs) contract.group_specs.push_back(std::move(spec.spec));
  KVRAIL_ASSIGN_OR_RETURN(JsonObject schema, top.Object("transfer_schema"));
  KVRAIL_ASSIGN_OR_RETURN(contract.transfer_schema,
                          ReadRecords(schema, "fields", &ReadSchemaField));
  KVRAIL_RETURN_IF_ERROR(ValidateContract(contract));
  return contract;
}

absl::Status ValidateContract(const Contract& contract) {
  const CachePlan& plan = contract.plan;
  int64_t arena_bytes;
  if (!CheckedMul(plan.num_lcm_blocks + 1, plan.lcm_block_bytes, &arena_bytes)) {
    return ContractError("plan", "(num_lcm_blocks + 1) * lcm_block_bytes is too large");
  }
  // A narrowed plan keeps part of each parent block resident (§12.1), never more than the whole
  // parent: kvrail requires 0 <= resident_block_bytes <= lcm_block_bytes (the reference reads it
  // unchecked). Then the arena above bounds ArenaBytes() too.
  if (plan.resident_block_bytes.has_value() &&
      (*plan.resident_block_bytes < 0 || *plan.resident_block_bytes > plan.lcm_block_bytes)) {
    return ContractError("plan.resident_block_bytes",
                         absl::StrCat("must be in [0, lcm_block_bytes ", plan.lcm_block_bytes,
                                      "] (the bytes of a parent block a narrowed plan keeps), "
                                      "got ",
                                      *plan.resident_block_bytes, " (kvrail strict rule)"),
                         kRevisionSection);
  }
  KVRAIL_RETURN_IF_ERROR(
      RequireUniqueIds(plan.groups, "plan.groups", "group_id",
                       [](const GroupLayout& r) -> const std::string& { return r.group_id; }));
  KVRAIL_RETURN_IF_ERROR(
      RequireUniqueIds(plan.planes, "plan.planes", "plane_id",
                       [](const PlaneLayout& r) -> const std::string& { return r.plane_id; }));
  KVRAIL_RETURN_IF_ERROR(
      RequireUniqueIds(plan.fields, "plan.fields", "field_id",
                       [](const FieldLayout& r) -> const std::string& { return r.field_id; }));
  KVRAIL_RETURN_IF_ERROR(
      RequireUniqueIds(contract.group_specs, "group_specs", "group_id",
                       [](const GroupSpec& r) -> const std::string& { return r.group_id; }));
  for (size_t i = 0; i < plan.fields.size(); ++i) {
    const FieldLayout& field = plan.fields[i];
    const std::string path = absl::StrCat("plan.fields[", i, "]");
    int64_t bytes = DTypeSize(field.dtype);
    for (int64_t extent : field.shape) {
      if (extent < 1 || !CheckedMul(bytes, extent, &bytes)) {
        return ContractError(absl::StrCat(path, ".shape"),
                             "extents must be >= 1 and the page payload at most 2^52 bytes");
      }
    }
    if (contract.FindPlane(field.plane_id) == nullptr) {
      return ContractError(
          absl::StrCat(path, ".plane_id"),
          absl::StrCat("plane '", field.plane_id, "' is not in plan.planes (kvrail strict rule)"));
    }
    if (contract.FindGroup(field.group_id) == nullptr) {
      return ContractError(
          absl::StrCat(path, ".group_id"),
          absl::StrCat("group '", field.group_id, "' is not in plan.groups (kvrail strict rule)"));
    }
  }
  // The plan's groups and the specs name the same set (as build_cache_transfer_contract
  // requires, §4.4); a spec without plan entry would fail only at manifest validation.
  for (size_t i = 0; i < contract.group_specs.size(); ++i) {
    const GroupSpec& spec = contract.group_specs[i];
    const std::string path = absl::StrCat("group_specs[", i, "]");
    KVRAIL_RETURN_IF_ERROR(ValidateGroupSpec(spec, contract.revision, path));
    const GroupLayout* layout = contract.FindGroup(spec.group_id);
    if (layout == nullptr) {
      return ContractError(absl::StrCat(path, ".group_id"),
                           absl::StrCat("group '", spec.group_id,
                                        "' has no plan.groups entry (kvrail strict rule)"));
    }
    // Manifests address virtual block ids below 1 + (page_count - 1) * shard_count (§12.2).
    int64_t virtual_pages;
    if (!CheckedMul(layout->page_count - 1, spec.shard_count, &virtual_pages) ||
        virtual_pages >= kMaxContractInteger) {
      return ContractError(absl::StrCat(path, ".shard_count"),
                           absl::StrCat("group '", spec.group_id, "': 1 + (page_count - 1) * ",
                                        "shard_count exceeds 2^52"),
                           "CACHEPD §12.2");
    }
  }
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    if (contract.FindGroupSpec(plan.groups[i].group_id) == nullptr) {
      return ContractError(absl::StrCat("plan.groups[", i, "].group_id"),
                           absl::StrCat("group '", plan.groups[i].group_id,
                                        "' has no group_specs entry (kvrail strict rule)"));
    }
  }
  std::set<absl::string_view> schema_ids;
  for (size_t i = 0; i < contract.transfer_schema.size(); ++i) {
    const SchemaField& entry = contract.transfer_schema[i];
    const std::string path = absl::StrCat("transfer_schema.fields[", i, "]");
    if (entry.field_id.empty()) {
      return ContractError(absl::StrCat(path, ".field_id"), "must not be empty");
    }
    if (!schema_ids.insert(entry.field_id).second) {
      return ContractError(
          absl::StrCat(path, ".field_id"),
          absl::StrCat("cache transfer schema contains a duplicate field '", entry.field_id, "'"));
    }
    if (contract.FindField(entry.field_id) == nullptr) {
      return ContractError(
          absl::StrCat(path, ".field_id"),
          absl::StrCat("cache transfer schema references unknown field '", entry.field_id, "'"));
    }
    KVRAIL_RETURN_IF_ERROR(ValidatePartition(contract, entry, path));
  }
  return absl::OkStatus();
}

namespace {

// Whether `form` can carry `contract` (see SerializeContract in contract.h).
absl::Status CheckWritableAs(const Contract& contract, Revision form) {
  for (size_t i = 0; i < contract.group_specs.size(); ++i) {
    const GroupSpec& spec = contract.group_specs[i];
    const std::string path = absl::StrCat("group_specs[", i, "]");
    if (form == Revision::kSnapshot && spec.shard_count != 1) {
      return ContractError(
          absl::StrCat(path, ".shard_count"),
          absl::StrCat("group '", spec.group_id, "' has shard_count ", spec.shard_count,
                       ", which the snapshot form cannot express"),
          kRevisionSection);
    }
    if (form == Revision::k2026_09) {
      absl::Status valid = CheckRevisedGeometry(spec, path);
      if (!valid.ok()) {
        return MakeError(ErrorCategory::kInvalidContract,
                         absl::StrCat("cannot write the 2026-09 form: ", valid.message()));
      }
    }
  }
  if (form == Revision::kSnapshot && contract.plan.resident_block_bytes.has_value()) {
    return ContractError("plan.resident_block_bytes",
                         absl::StrCat("is ", *contract.plan.resident_block_bytes,
                                      ", which the snapshot form cannot express (its peer would "
                                      "size the arena by lcm_block_bytes)"),
                         kRevisionSection);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SerializeContract(const Contract& contract) {
  return SerializeContract(contract, contract.revision);
}

absl::StatusOr<std::string> SerializeContract(const Contract& contract, Revision form) {
  KVRAIL_RETURN_IF_ERROR(CheckWritableAs(contract, form));
  // §4.1's member order; 2026-09 adds replayable after sliding_window_tokens, shard_count last in
  // a group spec and resident_block_bytes last in the plan (§12.1).
  const bool revised = form == Revision::k2026_09;
  ordered_json groups = ordered_json::array();
  for (const GroupLayout& g : contract.plan.groups) {
    groups.push_back({{"group_id", g.group_id},
                      {"cache_blocks_per_lcm_block", g.cache_blocks_per_lcm_block},
                      {"page_count", g.page_count}});
  }
  ordered_json planes = ordered_json::array();
  for (const PlaneLayout& p : contract.plan.planes) {
    planes.push_back({{"plane_id", p.plane_id},
                      {"bytes_per_lcm_block", p.bytes_per_lcm_block},
                      {"arena_offset_bytes", p.arena_offset_bytes}});
  }
  ordered_json fields = ordered_json::array();
  for (const FieldLayout& f : contract.plan.fields) {
    fields.push_back({{"group_id", f.group_id},
                      {"field_id", f.field_id},
                      {"plane_id", f.plane_id},
                      {"shape", f.shape},
                      {"dtype", DTypeName(f.dtype)},
                      {"field_offset_bytes", f.field_offset_bytes},
                      {"page_stride_bytes", f.page_stride_bytes}});
  }
  ordered_json specs = ordered_json::array();
  for (const GroupSpec& s : contract.group_specs) {
    ordered_json spec = {{"group_id", s.group_id},
                         {"retention", RetentionName(s.retention)},
                         {"rows_per_page", OptionalToJson(s.rows_per_page)},
                         {"entry_stride_tokens", OptionalToJson(s.entry_stride_tokens)},
                         {"sliding_window_tokens", OptionalToJson(s.sliding_window_tokens)}};
    if (revised) spec["replayable"] = s.replayable;
    spec["family"] = s.family;
    spec["transfer_policy"] = TransferPolicyName(s.transfer_policy);
    spec["checkpoint_granularity"] = OptionalToJson(s.checkpoint_granularity);
    if (revised) spec["shard_count"] = s.shard_count;
    specs.push_back(std::move(spec));
  }
  ordered_json schema = ordered_json::array();
  for (const SchemaField& e : contract.transfer_schema) {
    schema.push_back({{"field_id", e.field_id},
                      {"partition",
                       {{"axis", e.partition.axis},
                        {"global_extent", e.partition.global_extent},
                        {"global_parts", e.partition.global_parts}}}});
  }
  ordered_json plan = {{"prefix_granularity", contract.plan.prefix_granularity},
                       {"lcm_block_bytes", contract.plan.lcm_block_bytes},
                       {"num_lcm_blocks", contract.plan.num_lcm_blocks},
                       {"groups", std::move(groups)},
                       {"planes", std::move(planes)},
                       {"fields", std::move(fields)}};
  if (revised) plan["resident_block_bytes"] = OptionalToJson(contract.plan.resident_block_bytes);
  ordered_json root = {{"plan", std::move(plan)},
                       {"group_specs", std::move(specs)},
                       {"transfer_schema", {{"fields", std::move(schema)}}}};
  KVRAIL_ASSIGN_OR_RETURN(std::string wire,
                          DumpCanonical(root, ErrorCategory::kInvalidContract, "contract"));
  if (wire.size() > kMaxContractBytes) {
    return ContractError(
        "", absl::StrCat("canonical wire of ", wire.size(), " bytes exceeds ", kMaxContractBytes),
        "CACHEPD §4.2");
  }
  return wire;
}

absl::Status CheckArenaFits(const Contract& contract) {
  const int64_t arena = contract.ArenaBytes();
  for (const FieldLayout& field : contract.plan.fields) {
    const GroupLayout* group = contract.FindGroup(field.group_id);
    KVRAIL_ASSIGN_OR_RETURN(int64_t first, PageOffset(contract, field, 0));
    KVRAIL_ASSIGN_OR_RETURN(int64_t last, PageOffset(contract, field, group->page_count - 1));
    if (last + PayloadBytes(field) > arena) {
      return ContractError(
          absl::StrCat("field '", field.field_id, "'"),
          absl::StrCat("pages span arena bytes [", first, ", ", last + PayloadBytes(field),
                       ") but the arena holds ", arena, " bytes"),
          "CACHEPD §4.6");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPeerContracts(const Contract& prefill, const Contract& decode) {
  if (prefill.plan.prefix_granularity != decode.plan.prefix_granularity) {
    return PeerError(absl::StrCat("prefix_granularity ", prefill.plan.prefix_granularity,
                                  " != ", decode.plan.prefix_granularity));
  }
  std::vector<absl::string_view> prefill_groups, decode_groups;
  for (const GroupSpec& s : prefill.group_specs) prefill_groups.push_back(s.group_id);
  for (const GroupSpec& s : decode.group_specs) decode_groups.push_back(s.group_id);
  if (prefill_groups != decode_groups) {
    return PeerError(absl::StrCat("group sequence [", absl::StrJoin(prefill_groups, ","), "] != [",
                                  absl::StrJoin(decode_groups, ","), "]"));
  }
  for (size_t i = 0; i < prefill.group_specs.size(); ++i) {
    const GroupSpec& p = prefill.group_specs[i];
    const GroupSpec& d = decode.group_specs[i];
    // The members §4.5 item 3 compares, in its order, then replayable (§12.1). shard_count is
    // not compared: a prefill may shard a group its decode holds whole (§12.8).
    struct Member {
      const char* name;
      bool equal;
      absl::string_view section;
    };
    const Member members[] = {
        {"family", p.family == d.family, "CACHEPD §4.5"},
        {"rows_per_page", p.rows_per_page == d.rows_per_page, "CACHEPD §4.5"},
        {"entry_stride_tokens", p.entry_stride_tokens == d.entry_stride_tokens, "CACHEPD §4.5"},
        {"checkpoint_granularity", p.checkpoint_granularity == d.checkpoint_granularity,
         "CACHEPD §4.5"},
        {"retention", p.retention == d.retention, "CACHEPD §4.5"},
        {"sliding_window_tokens", p.sliding_window_tokens == d.sliding_window_tokens,
         "CACHEPD §4.5"},
        {"transfer_policy", p.transfer_policy == d.transfer_policy, "CACHEPD §4.5"},
        // Compared only when both wires can state it: a snapshot-form contract has no such member,
        // and replayable changes no slot selection (§12.1), so the bytes either side moves are
        // the same; kvrail meets a snapshot-era peer here where the newer reference cannot.
        {"replayable",
         p.replayable == d.replayable || prefill.revision == Revision::kSnapshot ||
             decode.revision == Revision::kSnapshot,
         kRevisionSection},
    };
    for (const Member& member : members) {
      if (!member.equal) {
        return PeerError(absl::StrCat("group '", p.group_id, "' ", member.name, " differs"),
                         member.section);
      }
    }
  }
  for (const GroupSpec& spec : prefill.group_specs) {
    std::vector<const FieldLayout*> pf = prefill.FieldsOfGroup(spec.group_id);
    std::vector<const FieldLayout*> df = decode.FieldsOfGroup(spec.group_id);
    std::vector<absl::string_view> pids, dids;
    for (const FieldLayout* f : pf) pids.push_back(f->field_id);
    for (const FieldLayout* f : df) dids.push_back(f->field_id);
    if (pids != dids) {
      return PeerError(absl::StrCat("group '", spec.group_id, "' fields [",
                                    absl::StrJoin(pids, ","), "] != [", absl::StrJoin(dids, ","),
                                    "]"));
    }
    for (size_t i = 0; i < pf.size(); ++i) {
      const FieldLayout& a = *pf[i];
      const FieldLayout& b = *df[i];
      if (a.dtype != b.dtype) {
        return PeerError(absl::StrCat("field '", a.field_id, "' dtype ", DTypeName(a.dtype),
                                      " != ", DTypeName(b.dtype)));
      }
      const Partition* pa = prefill.FindPartition(a.field_id);
      const Partition* pb = decode.FindPartition(b.field_id);
      if ((pa == nullptr) != (pb == nullptr) || (pa != nullptr && *pa != *pb)) {
        return PeerError(absl::StrCat("field '", a.field_id, "' partitions differ"));
      }
      std::vector<int64_t> ga = GlobalShape(a, pa);
      std::vector<int64_t> gb = GlobalShape(b, pb);
      if (ga != gb) {
        return PeerError(absl::StrCat("field '", a.field_id, "' global shape [",
                                      absl::StrJoin(ga, ","), "] != [", absl::StrJoin(gb, ","),
                                      "]"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail::layout
