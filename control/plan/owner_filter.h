// Owner filters for block-sharded (KV-parallel) cache groups (CACHEPD §10.3; semantics in
// docs/owner-filters.md).
//
// A prefill node may shard a cache group by block ownership: the `owners` prefill TP ranks of
// an owner subgroup hold the same heads (they are replicas for the TP partition) but each holds
// only every owners-th block, page-cyclically by logical slot (block-table column):
//
//     prefill rank r owns slot s of a sharded group  <=>  s % owners == r % owners.
//
// Because the slot is the block-table column, not the manifest position, ownership does not
// depend on the room's prefix: both peers compute it from (prefix_len, prompt_len) alone.
// The route then takes, for every byte range of a sharded group that §6.3 would take from one
// representative rank, all `owners` ranks of its subgroup, each with the filter
// {owners, r % owners}: every rank of the chosen subgroup serves the decode rank with the
// blocks it owns ("a KVP-sharded source is never idle").
#ifndef KVRAIL_CONTROL_PLAN_OWNER_FILTER_H_
#define KVRAIL_CONTROL_PLAN_OWNER_FILTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"

namespace kvrail::plan {

// A prefill node's declaration that `group_id` is sharded over `owners` ranks (>= 2).
struct ShardedGroup {
  std::string group_id;
  int owners = 2;
};

// Which blocks of a sharded group one prefill rank sends: slots s with s % owners == owner.
struct OwnerFilter {
  int owners = 1;
  int owner = 0;
  bool Owns(int64_t slot) const { return slot % owners == owner; }
};

bool operator==(const OwnerFilter& a, const OwnerFilter& b);

// The filter of one sharded group for one prefill rank.
struct GroupOwnerFilter {
  std::string group_id;
  OwnerFilter filter;
};

bool operator==(const GroupOwnerFilter& a, const GroupOwnerFilter& b);

// The filter of `group_id` in `filters`, or nullptr when that group is not filtered.
const OwnerFilter* FindOwnerFilter(absl::Span<const GroupOwnerFilter> filters,
                                   absl::string_view group_id);

// Checks a declaration against the prefill contract and TP size: each group is a group spec,
// named once, with 2 <= owners <= prefill_tp and prefill_tp % owners == 0. Errors are
// unsupported-layout and name the group.
absl::Status ValidateShardedGroups(absl::Span<const ShardedGroup> sharded,
                                   const layout::Contract& prefill, int prefill_tp);

// The owner count of `group_id`, or 1 when it is not sharded.
int OwnersOf(absl::Span<const ShardedGroup> sharded, absl::string_view group_id);

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
// (CACHEPD §10.3, the Rust port's validate_owner_filters): each filter must belong to a
// sharded group declared in `sharded` with the same owner count and be the sender's own
// (owner == prefill_rank % owners); the senders of one byte range of a sharded group must
// hold the owners 0..owners-1 once each, and a byte range of an unsharded group must have
// exactly one sender, without a filter. Errors are unsupported-layout and name the field.
absl::Status ValidateOwnerCoverage(absl::Span<const RangeSender> senders,
                                   absl::Span<const ShardedGroup> sharded);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_OWNER_FILTER_H_
