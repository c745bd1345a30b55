// The cache transfer contract (CACHEPD §4): a rank's arena geometry and what every cache field
// means. Both peers exchange it; the planner and the address resolver read it.
#ifndef KVRAIL_CONTROL_LAYOUT_CONTRACT_H_
#define KVRAIL_CONTROL_LAYOUT_CONTRACT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/dtype.h"
#include "control/layout/revision.h"

namespace kvrail::layout {

// Contracts are at most 256 KiB on the wire (CACHEPD §4.2, §4.3).
inline constexpr size_t kMaxContractBytes = 262144;

// Every size, offset, count and extent in a contract is at most 2^52: far beyond any real
// arena, and small enough that the address arithmetic of §4.6 and §6.9 cannot overflow int64.
inline constexpr int64_t kMaxContractInteger = int64_t{1} << 52;

// The most partition parts a field may declare (CACHEPD §4.4).
inline constexpr size_t kMaxGlobalParts = 16;

// plan.groups[*]: how one cache group's pages pack into LCM blocks.
struct GroupLayout {
  std::string group_id;
  int64_t cache_blocks_per_lcm_block = 1;
  int64_t page_count = 1;  // 1 + num_lcm_blocks * cache_blocks_per_lcm_block; page 0 is null
};

// plan.planes[*]: one region of the arena.
struct PlaneLayout {
  std::string plane_id;
  int64_t bytes_per_lcm_block = 0;
  int64_t arena_offset_bytes = 0;
};

// plan.fields[*]: one cache field of one group, with its rank-local page shape.
struct FieldLayout {
  std::string group_id;
  std::string field_id;  // recipe convention "layer.<N>.<suffix>"
  std::string plane_id;
  std::vector<int64_t> shape;  // rank-local shape of one page
  DType dtype = DType::kUint8;
  int64_t field_offset_bytes = 0;
  int64_t page_stride_bytes = 0;
};

struct CachePlan {
  int64_t prefix_granularity = 1;
  int64_t lcm_block_bytes = 0;
  int64_t num_lcm_blocks = 0;
  std::vector<GroupLayout> groups;
  std::vector<PlaneLayout> planes;
  std::vector<FieldLayout> fields;
  // 2026-09 (§12.1): the per-LCM-block bytes resident in a rank's arena when its plan was
  // narrowed to one pipeline stage; then ArenaBytes() is (num_lcm_blocks + 1) times this.
  // Published contracts carry null (nullopt). Not on the snapshot's wire.
  std::optional<int64_t> resident_block_bytes;
};

enum class Retention { kFullHistory, kSlidingWindow };
enum class TransferPolicy { kFullSuffix, kLatestSnapshot };

absl::string_view RetentionName(Retention retention);
absl::string_view TransferPolicyName(TransferPolicy policy);

// group_specs[*]: what a group's blocks mean. Exactly one geometry is set: rows
// (rows_per_page and entry_stride_tokens) or checkpoint (state family only).
struct GroupSpec {
  std::string group_id;
  Retention retention = Retention::kFullHistory;
  std::optional<int64_t> rows_per_page;
  std::optional<int64_t> entry_stride_tokens;
  std::optional<int64_t> sliding_window_tokens;
  // "history" or "state" in practice. Kept as text: the reference never checks it, and its own
  // vectors carry other values that a conforming peer must accept (contracts.json
  // non_ascii_raw_utf8). Only "state" has a meaning: it allows checkpoint geometry (and, in the
  // 2026-09 form, requires it; §12.1).
  std::string family = "history";
  TransferPolicy transfer_policy = TransferPolicy::kFullSuffix;
  std::optional<int64_t> checkpoint_granularity;
  // 2026-09 (§12.1): a sliding-window group the scheduler rebuilds by bounded replay. Changes
  // no slot selection; compared between peers. The snapshot's form has no such member: false.
  bool replayable = false;
  // 2026-09 (§12.1, §12.8): how many cyclic owners hold the group's blocks; block id v > 0 is
  // owner (v - 1) mod shard_count's local page (v - 1) div shard_count + 1. 1: not sharded.
  // The snapshot's form has no such member: 1.
  int64_t shard_count = 1;

  // Tokens per block: rows_per_page * entry_stride_tokens, or checkpoint_granularity.
  int64_t block_granularity() const;
};

// transfer_schema.fields[*].partition: how a field splits over TP ranks (CACHEPD §4.4, §6.2).
struct Partition {
  int64_t axis = 0;
  int64_t global_extent = 0;
  std::vector<int64_t> global_parts;  // empty, or 2..16 parts summing to global_extent
};

bool operator==(const Partition& a, const Partition& b);
inline bool operator!=(const Partition& a, const Partition& b) { return !(a == b); }

struct SchemaField {
  std::string field_id;
  Partition partition;
};

// A validated contract. Obtain one from ParseContract or check a hand-built one with
// ValidateContract; every accessor below assumes a contract that passed validation.
struct Contract {
  CachePlan plan;
  std::vector<GroupSpec> group_specs;        // order is significant (§4.5, §5.3)
  std::vector<SchemaField> transfer_schema;  // only partitioned fields appear
  // The form the wire was in when parsed (ParseContract), and so the form its sender reads.
  // A hand-built contract says kNewestRevision.
  Revision revision = kNewestRevision;

  const GroupLayout* FindGroup(absl::string_view group_id) const;
  const PlaneLayout* FindPlane(absl::string_view plane_id) const;
  const FieldLayout* FindField(absl::string_view field_id) const;
  const GroupSpec* FindGroupSpec(absl::string_view group_id) const;
  // The partition of `field_id`, or nullptr for a replicated field.
  const Partition* FindPartition(absl::string_view field_id) const;
  // The fields of `group_id`, sorted by field_id in code-point order (§4.5 item 4, §6.1).
  std::vector<const FieldLayout*> FieldsOfGroup(absl::string_view group_id) const;
  // The bytes of the rank's arena: (num_lcm_blocks + 1) * lcm_block_bytes (§4.6), or, for a
  // plan narrowed to one pipeline stage, (num_lcm_blocks + 1) * resident_block_bytes (§12.1).
  int64_t ArenaBytes() const;
  // The bound on the block ids of `group_id`'s manifests (CACHEPD §12.2):
  // 1 + (page_count - 1) * shard_count, so ids 1..VirtualBlockCount - 1 are valid. With
  // shard_count 1 that is page_count (§5.2, §5.3). ValidateContract keeps it <= 2^52. 0 for a
  // group the plan lacks.
  int64_t VirtualBlockCount(absl::string_view group_id) const;
  int64_t VirtualBlockCount(const GroupLayout& group) const;
};

// prod(shape) * element size: the payload bytes of one page of `field` (§4.6).
int64_t PayloadBytes(const FieldLayout& field);

// The field's global shape: shape[axis] replaced by global_extent when partitioned (§4.5).
std::vector<int64_t> GlobalShape(const FieldLayout& field, const Partition* partition);

// Byte offset of page `page` of `field` in the arena (§4.6):
//   arena_offset + bytes_per_lcm_block - page_stride + page * page_stride + field_offset.
// Requires 0 <= page < page_count of the field's group; returns an error otherwise.
absl::StatusOr<int64_t> PageOffset(const Contract& contract, const FieldLayout& field,
                                   int64_t page);

// Parses a contract wire of either revision (§4.3; §12.1) and runs every check of §4.4 (and,
// for a 2026-09 wire, §12.1's) plus kvrail's strict rules (docs/cachepd-strictness.md). Errors
// are category invalid-contract and name the member.
//
// The wire decides its form (contract.revision): a group spec with `replayable` makes it
// 2026-09, and then every group spec must carry it; a spec with `shard_count` but without
// `replayable` is refused. Without group specs, `plan.resident_block_bytes` (even null) makes
// it 2026-09. Otherwise it is the snapshot's, checked exactly as the snapshot reference checks.
absl::StatusOr<Contract> ParseContract(absl::string_view wire);

// Runs the checks ParseContract runs on an already-built contract, those of
// `contract.revision`'s form.
absl::Status ValidateContract(const Contract& contract);

// The canonical wire of `form` (§4.2; for 2026-09 with §12.1's members and order),
// byte-identical to that revision's reference to_wire_bytes(). Fails (invalid-contract) when the
// result would exceed kMaxContractBytes, and when `form` cannot carry the contract:
//  * snapshot: a group with shard_count != 1, or plan.resident_block_bytes set. A replayable
//    group is written without the member: §12.1 says it changes no slot selection, and a
//    snapshot peer compares nothing about it (§4.5), so the snapshot peer reads the same plan.
//  * 2026-09: a group spec that breaks a §12.1 check the snapshot lacks (checkpoint geometry
//    with sliding_window retention; a state family with row geometry), which a 2026-09 peer
//    would refuse.
absl::StatusOr<std::string> SerializeContract(const Contract& contract, Revision form);

// SerializeContract(contract, contract.revision): the form the contract's wire came in.
absl::StatusOr<std::string> SerializeContract(const Contract& contract);

// Checks that every page of every field lies inside [0, ArenaBytes()). The reference never
// checks this (§4.4); kvrail runs it when an arena is attached to a contract.
absl::Status CheckArenaFits(const Contract& contract);

// The prefill/decode pair check of §4.5, which also compares `replayable` (§12.1) when both
// contracts are in the 2026-09 form (a snapshot-form contract cannot state it, and it changes no
// slot selection), and never shard_count (§12.8: only the prefill may shard). Errors are
// category incompatible-peer.
absl::Status CheckPeerContracts(const Contract& prefill, const Contract& decode);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_CONTRACT_H_
