// A staged arena (sidecar_core.h; engine/memory/arena_staging.h): a GPU arena over a transport
// that cannot reach GPU memory, or a shared-memory arena under --emulate-gpu-arena. The data
// plane reads and writes a host mirror of the arena's size in its place, at the same offsets.
//
//   Prefill: a room's source ranges are copied to the mirror in each destination's strand, once
//   its copies are known and before the room is submitted (prefill_transfers.cc), so that no
//   write reads a byte the engine's forward pass left only on the GPU.
//   Decode: a prefill rank's Success waits, in a strand, while the ranges that rank landed in
//   the mirror are copied to the arena, and counts only then: Success means landed, on the GPU.
//   A failure of that copy fails the room. A room failing meanwhile keeps its pages held until
//   the copy has returned (DecodeRooms::BeginStaging): Failed means fenced.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "control/plan/landing_copies.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/sidecar/prefill_sidecar.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

void DecodeSidecar::DeliverSuccessLocked(const std::vector<std::string>& message,
                                         const std::string& host) {
  if (const std::optional<LiveSuccess> success = LiveSuccessLocked(message)) {
    metrics.RoomFirstByte(success->room, absl::Now());  // the decode's first byte it can know
  }
  if (staging != nullptr && TakeForStagingLocked(message)) return;
  HandleMessageLocked(message, RoomNow(), host);
}

bool DecodeSidecar::TakeForStagingLocked(const std::vector<std::string>& message) {
  const std::optional<LiveSuccess> success = LiveSuccessLocked(message);
  if (!success) return false;
  std::shared_ptr<const layout::Manifest> manifest;
  std::shared_ptr<PrefillNode> node;
  if (!LandingInputsLocked(*success, "staging", "cannot be copied to the GPU arena", manifest,
                           node)) {
    return true;
  }
  const uint64_t room = success->room;
  const uint32_t rank = success->rank;
  rooms->BeginStaging(room);  // its pages are held until the copy returned
  strands.Post(absl::StrCat("stage ", room),
               [this, message, room, rank, manifest = std::move(manifest),
                node = std::move(node)]() mutable {
                 StageLanded(std::move(message), room, rank, std::move(manifest), std::move(node));
               });
  return true;
}

void DecodeSidecar::StageLanded(std::vector<std::string> success, uint64_t room, uint32_t rank,
                                std::shared_ptr<const layout::Manifest> manifest,
                                std::shared_ptr<PrefillNode> node) {
  const absl::Status copied = [&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<const plan::CopyPlan> landing,
                            LandingPlanOf(*node, rank));
    // A head-sliced page's rows as one range (one 2-D copy a chunk on a GPU).
    plan::CopyList copies;
    KVRAIL_RETURN_IF_ERROR(plan::LandingCopies(*landing, *manifest, copies, /*strided=*/true));
    return staging->FromMirror(MergedRanges(copies, CopySide::kDestination));
  }();
  Owned([&] {
    if (rooms) {
      if (copied.ok()) {
        HandleMessageLocked(success, RoomNow(), /*host=*/"");  // checked already
      } else {
        ApplyLocked(rooms->Fail(
            room,
            absl::StrFormat(
                "staging: copying what prefill rank %d landed back to the arena failed: "
                "%s",
                rank, DescribeError(copied)),
            RoomNow(), session::FailureCause::kEngine));
      }
    }
    // The copy has returned: the room's pages may be released now (if its fence answers came).
    if (rooms) ApplyLocked(rooms->EndStaging(room, RoomNow()));
  });
}

absl::Status PrefillSidecar::StageSources(const plan::CopyList& copies) {
  return AddContext(staging->ToMirror(MergedRanges(copies, CopySide::kSource)),
                    "staging the room's source bytes to the host mirror");
}

}  // namespace kvrail::sidecar
