// The block manifest (CACHEPD §5): per cache group, the block ids one request uses, and the
// prompt window (prefix_len, prompt_len) both peers agree on.
#ifndef KVRAIL_CONTROL_LAYOUT_MANIFEST_H_
#define KVRAIL_CONTROL_LAYOUT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"

namespace kvrail::layout {

// Manifests are at most 2 MiB on the wire (CACHEPD §5.1).
inline constexpr size_t kMaxManifestBytes = 2097152;

// Token counts are at most 2^48: far beyond any context length, small enough that the slot
// arithmetic of §5.2 cannot overflow.
inline constexpr int64_t kMaxTokens = int64_t{1} << 48;

struct ManifestGroup {
  std::string group_id;
  std::vector<int64_t> block_ids;
};

struct Manifest {
  std::vector<ManifestGroup> groups;
  int64_t prefix_len = 0;
  int64_t prompt_len = 0;
};

// The logical block-table columns [begin, end) a group carries (CACHEPD §5.2).
struct SlotRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};

// §5.2 `_logical_slots` for `spec` and a window with 0 <= prefix_len < prompt_len:
// full_suffix carries [prefix_len // g, ceil(prompt_len / g)), raised to the retained tail
// for sliding windows; latest_snapshot carries the single slot (prompt_len - 1) // g.
SlotRange LogicalSlots(const GroupSpec& spec, int64_t prefix_len, int64_t prompt_len);

// Parses a manifest wire (§5.1). Strict: integers only (no bools or floats), block ids and
// lengths non-negative, no duplicate members. Unknown members are ignored, as the reference
// does. Errors are category invalid-manifest.
absl::StatusOr<Manifest> ParseManifest(absl::string_view wire);

// The canonical wire (§5.1, §4.2 rules): {"groups":[{"group_id":..,"block_ids":[..]}..],
// "prefix_len":..,"prompt_len":..}.
absl::StatusOr<std::string> SerializeManifest(const Manifest& manifest);

// §5.3 validate_cache_manifest against `contract` (on the prefill: the decode's contract), in
// the reference's order: window, group order, prefix alignment, per-group count and bounds.
// Block ids are bounded by the group's virtual block count (§12.2): 0 < id <
// contract.VirtualBlockCount(group), which is page_count for an unsharded group.
absl::Status ValidateManifest(const Manifest& manifest, const Contract& contract);

// §5.2 build_cache_block_manifest: the manifest of one request whose block table for group i
// (in group_specs order) is block_tables[i]. Each needed slot must exist in the table and hold
// an id in 1..VirtualBlockCount(group)-1 (page_count - 1 for an unsharded group; §12.2).
absl::StatusOr<Manifest> BuildManifest(const Contract& contract,
                                       absl::Span<const std::vector<int64_t>> block_tables,
                                       int64_t prefix_len, int64_t prompt_len);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_MANIFEST_H_
