// The CachePD revision a peer speaks (docs/PROTOCOL.md §12): the snapshot's (§1-§11) or
// 2026-09's (§12). kvrail reads both and answers each peer in the form that peer sent; the
// revision is never a setting a user must get right (docs/PROTOCOL.md §12.12).
#ifndef KVRAIL_CONTROL_LAYOUT_REVISION_H_
#define KVRAIL_CONTROL_LAYOUT_REVISION_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace kvrail::layout {

enum class Revision {
  // tokenspeed at the snapshot f4d8ec6e (2026-08-22): contracts without replayable and
  // shard_count, PUT /route without pp_size, 5-frame status.
  kSnapshot,
  // tokenspeed from 2026-09 (docs/PROTOCOL.md §12): replayable and shard_count in every group
  // spec, resident_block_bytes in the plan, pp_size and cache_fields_by_stage on PUT /route and
  // in the sync answer, stage-major ranks, 7-frame status.
  k2026_09,
};

// What kvrail emits where nothing a peer sent decides: the newer revision.
inline constexpr Revision kNewestRevision = Revision::k2026_09;

// "snapshot" or "2026-09": the names flags, logs and docs use.
absl::string_view RevisionName(Revision revision);

// The revision named `name` ("snapshot" or "2026-09"), or nullopt.
std::optional<Revision> RevisionFromName(absl::string_view name);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_REVISION_H_
