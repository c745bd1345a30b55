// Send-time address resolution (CACHEPD §6.9, §6.10): a registration's fragments bound to
// both arenas' geometry once ("plan once"), then expanded per room over the paired block ids
// of the source and destination manifests into copies, and coalesced.
//
// Offsets are relative to each arena's base: the data plane adds the registered bases and
// checks every destination range against the decode's registered regions before posting.
#ifndef KVRAIL_CONTROL_PLAN_COPY_PLAN_H_
#define KVRAIL_CONTROL_PLAN_COPY_PLAN_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/fragment.h"
#include "control/plan/layerwise.h"
#include "control/plan/owner_filter.h"
#include "engine/base/copy_list.h"

namespace kvrail::plan {

// Copy and CopyList live in engine/base/copy_list.h, so that the data plane (engine/transfer)
// takes them without depending on the planner.
using ::kvrail::Copy;
using ::kvrail::CopyList;

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
  // A page-sharded group's filter (§12.8): only the virtual source ids this rank owns, each
  // read from its local page. {0, 1} (every id, read as is) for a replicated group.
  OwnerFilter owner;
};

class CopyPlan;

// Walks one room's copies in batches, in Expand's order, without materialising the whole list:
// the sender fills a bounded, cache-resident batch, posts it, and asks for the next. Obtain
// one from CopyPlan::Begin; the plan and both manifests must outlive it.
class CopyCursor {
 public:
  // Writes up to `capacity` next copies to `out` and returns how many; 0 once done().
  size_t Next(Copy* out, size_t capacity);
  bool done() const;

 private:
  friend class CopyPlan;
  friend class CopyStream;
  CopyCursor(const CopyPlan* plan, const layout::Manifest* src, const layout::Manifest* dst,
             bool coalesce, const std::vector<char>* fragment_mask = nullptr, bool strided = false);
  void EnterFragment();
  template <bool kCoalesce>
  size_t Fill(Copy* __restrict out, size_t capacity);

  const CopyPlan* plan_;
  const layout::Manifest* src_;
  const layout::Manifest* dst_;
  bool coalesce_;
  const std::vector<char>* fragment_mask_;  // nullptr: every fragment; else 1 = send it
  bool strided_;  // a page's rows of a row fragment as one strided copy (CopyPlan::Begin)
  size_t fragment_ = 0;
  size_t position_ = 0;
  int64_t row_ = 0;
  Copy run_{0, 0, 0};  // the pending coalesced run; length 0 when none
};

// A registration's copy geometry: built once per (prefill rank, decode registration), used
// for every room of that registration.
class CopyPlan {
 public:
  // Binds `fragments` (the registration's, CACHEPD §6.8) to the prefill's own contract `src`
  // and the decode's registered contract `dst`. Empty `fragments` means equal TP: every field
  // of every group is copied whole, fields of a group in field_id order (§6.9).
  // `owner_filters` (the registration's decisions, §12.8) restrict a page-sharded group
  // (src's shard_count k > 1) to the manifest positions whose virtual source id this rank
  // owns, each read from its local page and written to the decode block at the same position.
  // Requires the contracts to have passed CheckPeerContracts. Fails (unsupported-layout) when
  // the decisions break §12.7 (ValidateOwnerDecisions against src's group specs), a fragment
  // names a field a contract lacks, or a fragment reads or writes outside its page.
  static absl::StatusOr<CopyPlan> Bind(const layout::Contract& src, const layout::Contract& dst,
                                       absl::Span<const Fragment> fragments,
                                       absl::Span<const GroupOwnerFilter> owner_filters = {});

  // Appends the copies of one room to `out` (reused across rooms, so a room allocates nothing
  // once `out` has grown), in the reference's order: group spec order, then fragment order,
  // then block pairs by position, then rows (§6.9). The manifests are paired group by group;
  // both must name the contract's groups in order with equal block counts, and every block
  // id must be a page of its side (1..page_count-1; for a page-sharded source group a virtual
  // id, 1..VirtualBlockCount-1, §12.2, §12.8). On error nothing is appended.
  absl::Status Expand(const layout::Manifest& src, const layout::Manifest& dst,
                      CopyList& out) const;

  // Expand, coalescing as it goes (the result equals Expand followed by Coalesce over the
  // appended copies, without materialising the uncoalesced list): the per-room hot path.
  absl::Status ExpandCoalesced(const layout::Manifest& src, const layout::Manifest& dst,
                               CopyList& out) const;

  // Checks a room's manifests as Expand does and returns a cursor over its copies, coalesced
  // as they are produced when `coalesce` (the same list as ExpandCoalesced). With `strided`, a
  // fragment of rows (a head-sliced field of a mismatched TP route) yields each page's rows as
  // one strided copy (Copy::rows, its row strides) where Expand yields a copy per row: the same
  // bytes to the same places, in the same order. With `coalesce`, a strided copy that goes on
  // where the one before it ends (the next page, with both sides' pages back to back) merges
  // into it as more rows; a strided copy never merges with a plain one (rows that turn out
  // contiguous on both sides are one plain copy).
  absl::StatusOr<CopyCursor> Begin(const layout::Manifest& src, const layout::Manifest& dst,
                                   bool coalesce, bool strided = false) const;

  // Layerwise mode (§6.11): appends the copies of one chunk, coalesced: for each group the
  // selection's source blocks paired with the decode manifest's blocks at the selection's
  // positions, restricted to the fields in `field_ids` (the producer steps of this round), in
  // Expand's order. Not combined with owner filters (unsupported-layout).
  absl::Status ExpandChunk(absl::Span<const GroupSelection> selection,
                           absl::Span<const std::string> field_ids, const layout::Manifest& dst,
                           CopyList& out) const;

  // Layer-wise streaming of a whole prompt (CACHEPD §6.11 producer steps, as one chunk): the
  // copies ExpandCoalesced (or Expand, without `coalesce`) would append, restricted to the
  // fragments of fields "layer.<N>.*" with layers.begin <= N < layers.end, in the same order.
  // Requires layered() (FailedPrecondition otherwise, naming the field). Owner filters apply as
  // in Expand.
  struct LayerRange {
    int64_t begin = 0;
    int64_t end = INT64_MAX;
  };
  absl::Status ExpandLayers(const layout::Manifest& src, const layout::Manifest& dst,
                            LayerRange layers, bool coalesce, CopyList& out) const;
  // OK when every fragment's field is "layer.<N>.<suffix>" (§6.11); else the error that names
  // the first one that is not: such a contract has no producer steps to stream.
  absl::Status layered() const { return layered_; }
  // The layer N of fragment `index` (fragments() order); -1 for a field not of that form.
  int64_t fragment_layer(size_t index) const { return fragment_layers_[index]; }

  // The number of copies Expand would append (before coalescing) for these manifests.
  int64_t CountCopies(const layout::Manifest& src) const;

  // Whether this plan sends manifest position `position` of the fragment's group for a room
  // whose source manifest is `room`: always, unless the group is page-sharded and another
  // owner holds the virtual id there (§12.8).
  bool SendsPosition(const BoundFragment& fragment, const layout::Manifest& room,
                     size_t position) const;
  // The source page of manifest block id `source_id` for `fragment`: the id itself, or for a
  // page-sharded group the owner's local page (v - 1) div k + 1 (§12.8).
  static int64_t SourcePage(const BoundFragment& fragment, int64_t source_id) {
    return fragment.owner.owner_count > 1 ? fragment.owner.LocalPage(source_id) : source_id;
  }

  absl::Span<const BoundFragment> fragments() const { return fragments_; }
  bool whole_field() const { return whole_field_; }
  size_t group_count() const { return group_count_; }

 private:
  friend class CopyCursor;
  friend class CopyStream;
  absl::Status CheckRoom(const layout::Manifest& src, const layout::Manifest& dst) const;
  absl::Status ExpandInto(const layout::Manifest& src, const layout::Manifest& dst, CopyList& out,
                          bool coalesce) const;
  // 1 for each fragment of a layer in `layers`, 0 for the others (fragments() order).
  std::vector<char> LayerMask(LayerRange layers) const;
  // CountCopies over the fragments `mask` selects (every fragment when null).
  int64_t CountMasked(const layout::Manifest& src, const std::vector<char>* mask) const;
  // Appends to `out` what a cursor over (src, dst) yields through `mask`: at most the masked
  // count, reserved once.
  void Drain(const layout::Manifest& src, const layout::Manifest& dst, bool coalesce,
             const std::vector<char>* mask, CopyList& out) const;

  std::vector<BoundFragment> fragments_;  // sorted by group_index, stable
  // Block id bounds per group: src (Contract::VirtualBlockCount, §12.2), dst (page_count).
  std::vector<std::pair<int64_t, int64_t>> group_pages_;
  std::vector<std::string> fragment_fields_;  // the field of each bound fragment
  std::vector<int64_t> fragment_layers_;      // its layer N (§6.11), or -1
  absl::Status layered_;                      // why fragment_layers_ holds a -1, if it does
  size_t group_count_ = 0;
  bool whole_field_ = false;
};

// The most bytes a merged copy carries (Coalesce, ExpandCoalesced, a coalescing cursor): a run
// that would grow past it ends and the next copy starts a new one. The scheduler cuts anything
// longer into writes of at most 4 MiB anyway (SchedulerOptions::slice_bytes), and a bounded run
// bounds what a cursor walks per copy it yields: a field's pages back to back were one copy, so
// the scheduler's first pull of 64 copies of a 16k-token room walked nearly all of its pages
// before the room's first byte (BENCHMARKS.md, "The first byte of a large room").
inline constexpr uint64_t kMostMergedBytes = uint64_t{4} << 20;

// Merges, in place, each run of consecutive copies where the next one starts exactly where the
// previous one ends on both sides, into one copy of at most kMostMergedBytes (a copy longer
// than that alone stays as it is) (linear, allocation-free). Returns the number of copies left.
// Copies are never reordered, so the bytes written and the order of the writes' first bytes are
// unchanged.
size_t Coalesce(std::vector<Copy>& copies);
size_t Coalesce(CopyList& copies);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_COPY_PLAN_H_
