// Send-time address resolution (CACHEPD §6.9, §6.10): a registration's fragments bound to
// both arenas' geometry once ("plan once"), then expanded per room over the paired block ids
// of the source and destination manifests into copies, and coalesced.
//
// Offsets are relative to each arena's base: the data plane adds the registered bases and
// checks every destination range against the decode's registered regions before posting.
#ifndef KVRAIL_CONTROL_PLAN_COPY_PLAN_H_
#define KVRAIL_CONTROL_PLAN_COPY_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/fragment.h"
#include "control/plan/owner_filter.h"

namespace kvrail::plan {

// One contiguous copy: `length` bytes from prefill arena offset `src_offset` to decode arena
// offset `dst_offset`.
struct Copy {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
};

bool operator==(const Copy& a, const Copy& b);
inline bool operator!=(const Copy& a, const Copy& b) { return !(a == b); }

// One fragment (or one whole field) with both sides' page-zero offsets and strides resolved.
// Expanding it for a page pair (s, t) needs only multiplications and additions.
struct BoundFragment {
  int group_index = 0;   // index into the contracts' group_specs (same order both sides)
  int64_t src_base = 0;  // offset_src(f, 0) + fragment.src_byte_offset
  int64_t dst_base = 0;  // offset_dst(f, 0) + fragment.dst_byte_offset
  int64_t src_page_stride = 0;
  int64_t dst_page_stride = 0;
  int64_t src_row_stride = 0;
  int64_t dst_row_stride = 0;
  int64_t bytes_per_row = 0;
  int64_t rows = 1;
  int64_t src_page_count = 0;  // pages valid on each side: ids must be in 1..count-1
  int64_t dst_page_count = 0;
  OwnerFilter owner;  // a block-sharded group: only slots this rank owns (§10.3); else 1 owner
};

// A registration's copy geometry: built once per (prefill rank, decode registration), used
// for every room of that registration.
class CopyPlan {
 public:
  // Binds `fragments` (the registration's, CACHEPD §6.8) to the prefill's own contract `src`
  // and the decode's registered contract `dst`. Empty `fragments` means equal TP: every field
  // of every group is copied whole, fields of a group in field_id order (§6.9).
  // `owner_filters` (the registration's, §10.3) restrict a sharded group's blocks to the slots
  // this rank owns. Requires the contracts to have passed CheckPeerContracts. Fails
  // (unsupported-layout) when a fragment names a field a contract lacks, a fragment reads or
  // writes outside its page, or a filter names an unknown group or an invalid owner.
  static absl::StatusOr<CopyPlan> Bind(const layout::Contract& src, const layout::Contract& dst,
                                       absl::Span<const Fragment> fragments,
                                       absl::Span<const GroupOwnerFilter> owner_filters = {});

  // Appends the copies of one room to `out` (reused across rooms, so a room allocates nothing
  // once `out` has grown), in the reference's order: group spec order, then fragment order,
  // then block pairs by position, then rows (§6.9). The manifests are paired group by group;
  // both must name the contract's groups in order with equal block counts, and every block
  // id must be a page of its side (1..page_count-1). On error nothing is appended.
  absl::Status Expand(const layout::Manifest& src, const layout::Manifest& dst,
                      std::vector<Copy>& out) const;

  // The number of copies Expand would append (before coalescing) for these manifests.
  int64_t CountCopies(const layout::Manifest& src) const;

  // Whether this plan sends manifest position `position` of group `group_index` for a room
  // with this prompt window: always, unless the group is block-sharded and another rank owns
  // that slot.
  bool SendsPosition(const BoundFragment& fragment, const layout::Manifest& room,
                     size_t position) const;

  absl::Span<const BoundFragment> fragments() const { return fragments_; }
  bool whole_field() const { return whole_field_; }
  size_t group_count() const { return group_count_; }

 private:
  std::vector<BoundFragment> fragments_;        // sorted by group_index, stable
  std::vector<layout::GroupSpec> group_specs_;  // the slot rules of §5.2, for owner filters
  size_t group_count_ = 0;
  bool whole_field_ = false;
};

// Merges, in place, each run of consecutive copies where the next one starts exactly where the
// previous one ends on both sides, into one copy (linear, allocation-free). Returns the number
// of copies left. Copies are never reordered, so the bytes written and the order of the
// writes' first bytes are unchanged.
size_t Coalesce(std::vector<Copy>& copies);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_COPY_PLAN_H_
