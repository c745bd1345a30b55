// A room's copies as a CopySource (engine/base/copy_source.h): the plan's cursor, pulled a
// chunk at a time by the transfer scheduler, so that a head-sliced room's half a million copies
// a rank are never materialised and its first writes go out while the rest are still to be
// computed. The envelope is the plan's own bound of the room, computed from the block tables
// (a pass over fragments and blocks, not over rows) before the first copy.
#ifndef KVRAIL_CONTROL_PLAN_COPY_STREAM_H_
#define KVRAIL_CONTROL_PLAN_COPY_STREAM_H_

#include <memory>

#include "absl/status/statusor.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "engine/base/copy_source.h"

namespace kvrail::plan {

// The copies ExpandCoalesced (coalesce) or Expand would append for (src, dst), or, with a layer
// range other than the default, those ExpandLayers would: the same copies in the same order,
// or with `strided` the same bytes with each page's rows of a row fragment as one strided copy,
// merged with the next page's when `coalesce` and both sides' pages are back to back
// (CopyPlan::Begin). The same errors as those, before anything is produced. The stream keeps the
// plan and the manifests alive.
absl::StatusOr<std::unique_ptr<CopySource>> StreamRoom(std::shared_ptr<const CopyPlan> plan,
                                                       std::shared_ptr<const layout::Manifest> src,
                                                       std::shared_ptr<const layout::Manifest> dst,
                                                       CopyPlan::LayerRange layers, bool coalesce,
                                                       bool strided = false);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_COPY_STREAM_H_
