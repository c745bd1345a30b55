// Owner filters for page-sharded (DCP) prefill groups (CACHEPD §12.8, §12.7; the shape of
// §10.3; docs/owner-filters.md).
//
// A prefill contract declares a group sharded over k >= 2 owners with its group spec's
// shard_count = k. Its block ids in the prefill's manifests are then virtual: id v > 0 is held
// by owner (v - 1) mod k at that owner's local page (v - 1) div k + 1 (id 0 is the null
// block), and the group's page_count counts local pages. Prefill TP rank p is owner p mod k.
// A route carries, per source rank, one decision per sharded group: the filter
// (owner_rank = p mod k, owner_count = k) when the rank's fragments name the group, "none"
// otherwise. The sender keeps the manifest positions whose source id it owns and copies each
// from its local page to the decode block at the same position.
#ifndef KVRAIL_CONTROL_PLAN_OWNER_FILTER_H_
#define KVRAIL_CONTROL_PLAN_OWNER_FILTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"
#include "control/plan/fragment.h"

namespace kvrail::plan {

// The reference's CachePageOwnerFilter (§12.8): the blocks of a sharded group that owner
// `owner_rank` of `owner_count` holds.
struct OwnerFilter {
  int owner_rank = 0;
  int owner_count = 1;

  // Whether this owner holds virtual block id `virtual_id`: v > 0 and (v - 1) mod k == o.
  bool Owns(int64_t virtual_id) const {
    return virtual_id > 0 && (virtual_id - 1) % owner_count == owner_rank;
  }
  // The owner's local page of virtual block id `virtual_id` (> 0): (v - 1) div k + 1.
  int64_t LocalPage(int64_t virtual_id) const { return (virtual_id - 1) / owner_count + 1; }
};

bool operator==(const OwnerFilter& a, const OwnerFilter& b);

// The reference's CachePageOwnerFilter constructor check: 0 <= owner_rank < owner_count and
// owner_count >= 2. Errors (unsupported-layout) name both numbers.
absl::Status CheckOwnerFilter(const OwnerFilter& filter);

// One prefill rank's owner-filter decision for one sharded group (§12.7, §12.8).
struct GroupOwnerFilter {
  std::string group_id;
  // nullopt is the decision "none": the rank sends nothing of the group.
  std::optional<OwnerFilter> filter;
};

bool operator==(const GroupOwnerFilter& a, const GroupOwnerFilter& b);

// The filter of `group_id` in `decisions`, or nullptr when it has none (no decision, or "none").
const OwnerFilter* FindOwnerFilter(absl::Span<const GroupOwnerFilter> decisions,
                                   absl::string_view group_id);

// The reference's registration check of owner-filter decisions (§12.7,
// validate_rank_owner_filters) against the prefill rank's own group specs:
//   * every group with shard_count > 1 has a decision, and no other group has one;
//   * a filter's owner_count equals its group's shard_count;
//   * a group has a filter exactly when `fragments` name it.
// An empty `fragments` (the whole-field copy of §6.6) names every group. Errors are
// unsupported-layout, one line naming the group and the rule.
absl::Status ValidateOwnerDecisions(absl::Span<const Fragment> fragments,
                                    absl::Span<const GroupOwnerFilter> decisions,
                                    absl::Span<const layout::GroupSpec> group_specs);

// What a sharded sender keeps of one group of a room (§12.8, the reference's
// owned_local_pages): the manifest positions i whose source id it owns, the local page of
// each, and the decode's block at the same position.
struct OwnedBlocks {
  std::vector<int64_t> positions;
  std::vector<int64_t> source_local_pages;
  std::vector<int64_t> destination_block_ids;
};

// Selects the blocks `filter` owns from paired source (virtual) and destination block ids;
// `virtual_block_count` is the source group's layout::Contract::VirtualBlockCount (§12.2).
// Errors (invalid-manifest): a source id outside [0, virtual_block_count), naming it; lists of
// different lengths.
absl::StatusOr<OwnedBlocks> SelectOwnedBlocks(const OwnerFilter& filter,
                                              absl::Span<const int64_t> source_block_ids,
                                              absl::Span<const int64_t> destination_block_ids,
                                              int64_t virtual_block_count);

// One sender of a byte range of a decode rank's pages, as a route describes it.
struct RangeSender {
  int prefill_rank = 0;
  std::string group_id;
  std::string field_id;
  // The destination byte range within each page: `rows` rows of `bytes_per_row` bytes at
  // dst_byte_offset + row * dst_row_stride.
  int64_t dst_byte_offset = 0;
  int64_t dst_row_stride = 0;
  int64_t bytes_per_row = 0;
  int64_t rows = 1;
  const OwnerFilter* filter = nullptr;  // nullptr: every block
};

// Proves a decode rank's senders write every manifest block of every byte range exactly once
// (kvrail's check of a route, in the spirit of the Rust port's validate_owner_filters, §10.3):
// each filter must belong to a group `prefill` shards with owner_count == shard_count and be
// the sender's own (owner_rank == prefill_rank % owner_count); the senders of one byte range
// of a sharded group must hold owners 0..k-1 once each (so each virtual id v > 0, owned by
// exactly (v - 1) mod k, is sent once); a byte range of an unsharded group must have exactly
// one sender, without a filter. Errors are unsupported-layout and name the field.
absl::Status ValidateOwnerCoverage(absl::Span<const RangeSender> senders,
                                   const layout::Contract& prefill);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_OWNER_FILTER_H_
