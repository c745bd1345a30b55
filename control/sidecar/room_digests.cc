// --verify-digest on a decode (decode_sidecar.h; docs/SECURITY.md, "Digests"): a prefill rank's
// room digest is kept until its Success comes; the Success then waits while the bytes that
// landed are hashed in a strand (a 1 GiB room is tens of milliseconds of hashing, never on the
// owner thread), and counts only if the digests agree. A mismatch fails the room as any
// decode-local failure does: its pages are held and fenced through the prefill ranks that have not
// reported (DecodeRooms::Fail), so the rank whose bytes were wrong is asked to fence too.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "control/plan/landing_copies.h"
#include "control/plan/room_digest.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/wire/digest.h"
#include "control/wire/status.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

void DecodeSidecar::KeepDigestLocked(const std::vector<std::string>& message,
                                     const std::string& host) {
  absl::StatusOr<wire::RoomDigestMessage> digest = wire::ParseRoomDigest(message);
  if (!digest.ok()) {
    RefuseLocked(host, "room digest dropped: " + DescribeError(digest.status()));
    return;
  }
  // Kept with the room, for a rank of its route only, and gone with it (DecodeRooms::
  // KeepDigest): a peer's digests cannot grow it past its prefill ranks. One for a room not
  // tracked here (it ended) is dropped in silence, as CachePD drops its status frames.
  if (!options.verify_digest) return;
  const absl::Status kept = rooms->KeepDigest(
      digest->room, static_cast<int>(std::min<uint32_t>(digest->prefill_rank, INT32_MAX)),
      digest->digest);
  if (absl::IsInvalidArgument(kept)) {
    RefuseLocked(host, "room digest dropped: " + DescribeError(kept));
  }
}

std::optional<DecodeSidecar::LiveSuccess> DecodeSidecar::LiveSuccessLocked(
    const std::vector<std::string>& message) const {
  absl::StatusOr<wire::StatusMessage> status = wire::ParseStatusLenient(message);
  if (!status.ok() || status->status != static_cast<int>(session::TransferPoll::kSuccess)) {
    return std::nullopt;
  }
  const std::optional<session::DecodeRoomView> view = rooms->Find(status->room);
  if (!view || view->state == session::TransferPoll::kFailed) return std::nullopt;
  return LiveSuccess{status->room, status->prefill_rank, view->bootstrap_address};
}

bool DecodeSidecar::LandingInputsLocked(const LiveSuccess& success, const std::string& what,
                                        const std::string& cannot,
                                        std::shared_ptr<const layout::Manifest>& manifest,
                                        std::shared_ptr<PrefillNode>& node) {
  std::shared_ptr<const layout::Manifest> kept_manifest = rooms->ManifestOf(success.room);
  auto kept_node = nodes.find(success.bootstrap_address);
  if (kept_manifest == nullptr || kept_node == nodes.end()) {
    ApplyLocked(rooms->Fail(
        success.room,
        absl::StrFormat("%s: the bytes prefill rank %d wrote %s: the room's %s is no longer "
                        "known here",
                        what, success.rank, cannot,
                        kept_manifest == nullptr ? "manifest" : "prefill node"),
        RoomNow(),
        absl::StartsWith(what, "--verify-digest") ? session::FailureCause::kDigest
                                                  : session::FailureCause::kEngine));
    return false;
  }
  manifest = std::move(kept_manifest);
  node = kept_node->second;
  return true;
}

bool DecodeSidecar::TakeForDigestLocked(const std::vector<std::string>& message) {
  const std::optional<LiveSuccess> success = LiveSuccessLocked(message);
  if (!success) return false;
  const uint64_t room = success->room;
  const uint32_t rank = success->rank;
  const std::optional<uint64_t> kept = rooms->TakeDigest(room, static_cast<int>(rank));
  if (!kept) {
    // Nodes that are not kvrail's (those whose statuses need no sender proof) send no digest:
    // CachePD's rule, any Success counts.
    if (!SenderProofRequiredLocked(message)) return false;
    ApplyLocked(rooms->Fail(
        room,
        absl::StrFormat("--verify-digest: prefill rank %d sent Success without a room digest, and "
                        "its node is kvrail's (start its sidecars with --verify-digest too)",
                        rank),
        RoomNow(), session::FailureCause::kDigest));
    ++stats.room_digests_failed;
    return true;
  }
  const uint64_t sent = *kept;
  std::shared_ptr<const layout::Manifest> manifest;
  std::shared_ptr<PrefillNode> node;
  if (!LandingInputsLocked(*success, "--verify-digest", "cannot be checked", manifest, node)) {
    return true;
  }
  strands.Post(absl::StrCat("digest ", room), [this, message, room, rank, sent,
                                               manifest = std::move(manifest),
                                               node = std::move(node)]() mutable {
    CheckLanded(std::move(message), room, rank, sent, std::move(manifest), std::move(node));
  });
  return true;
}

void DecodeSidecar::CheckLanded(std::vector<std::string> success, uint64_t room, uint32_t rank,
                                uint64_t sent, std::shared_ptr<const layout::Manifest> manifest,
                                std::shared_ptr<PrefillNode> node) {
  absl::StatusOr<uint64_t> landed = [&]() -> absl::StatusOr<uint64_t> {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<const plan::CopyPlan> landing,
                            LandingPlanOf(*node, rank));
    plan::CopyList copies;
    // Strided copies: the digest takes their rows one by one (plan::RoomDigest).
    KVRAIL_RETURN_IF_ERROR(plan::LandingCopies(*landing, *manifest, copies, /*strided=*/true));
    return plan::RoomDigest(
        copies, plan::DigestSide::kDestination,
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(arena_base), arena_bytes));
  }();
  Owned([&] {
    if (!rooms) return;  // the arena went away meanwhile
    const absl::Time now = RoomNow();
    if (landed.ok() && *landed == sent) {
      ++stats.room_digests;
      DeliverSuccessLocked(success, /*host=*/"");  // checked already; its sender not kept
      return;
    }
    const std::string reason =
        landed.ok() ? absl::StrFormat(
                          "--verify-digest: prefill rank %d sent %s, the landed bytes "
                          "hash to %s",
                          rank, plan::FormatDigest(sent), plan::FormatDigest(*landed))
                    : absl::StrFormat(
                          "--verify-digest: the bytes prefill rank %d wrote cannot be "
                          "checked: %s",
                          rank, DescribeError(landed.status()));
    ++stats.room_digests_failed;
    ApplyLocked(rooms->Fail(room, reason, now, session::FailureCause::kDigest));
  });
}

absl::StatusOr<std::shared_ptr<const plan::CopyPlan>> DecodeSidecar::LandingPlanOf(
    PrefillNode& node, uint32_t rank) {
  std::shared_ptr<const plan::CopyPlan> known =
      Owned([&]() -> std::shared_ptr<const plan::CopyPlan> {
        auto cached = node.landing_plans.find(static_cast<int>(rank));
        return cached != node.landing_plans.end() ? cached->second : nullptr;
      });
  if (known != nullptr) return known;
  KVRAIL_ASSIGN_OR_RETURN(plan::CopyPlan bound,
                          plan::LandingPlan(node.description, options.tp_size, options.tp_rank,
                                            contract, static_cast<int>(rank)));
  auto landing = std::make_shared<const plan::CopyPlan>(std::move(bound));
  return Owned([&]() -> std::shared_ptr<const plan::CopyPlan> {
    return node.landing_plans.emplace(static_cast<int>(rank), landing).first->second;
  });
}

}  // namespace kvrail::sidecar
