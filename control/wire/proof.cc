#include "control/wire/proof.h"

#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/dispatch.h"
#include "control/wire/fence.h"
#include "control/wire/kvrail_frames.h"
#include "control/wire/limits.h"
#include "control/wire/preallocation.h"
#include "control/wire/row_staging.h"
#include "engine/base/error.h"

namespace kvrail::wire {

bool IsOwnerProof(absl::Span<const std::string> frames) {
  return HasMagic(frames, kOwnerProofMagic);
}

bool IsSenderProof(absl::Span<const std::string> frames) {
  return HasMagic(frames, kSenderProofMagic);
}

std::optional<uint64_t> ProvenRoomOf(absl::Span<const std::string> frames) {
  if (IsFenceRequest(frames)) {
    absl::StatusOr<FenceRequest> fence = ParseFenceRequest(frames);
    if (fence.ok()) return fence->room;
    return std::nullopt;
  }
  if (IsStagingOffer(frames)) {
    absl::StatusOr<StagingOffer> offer = ParseStagingOffer(frames);
    if (offer.ok()) return offer->room;
    return std::nullopt;
  }
  if (Classify(frames) != MessageKind::kPreallocation) return std::nullopt;
  absl::StatusOr<PreallocationRouteHeader> header = ParsePreallocationRouteHeader(frames);
  if (header.ok()) return header->room;
  return std::nullopt;
}

absl::StatusOr<SenderProof> ParseSenderProof(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(CheckShape(frames, kSenderProofMagic, "sender proof", 4));
  SenderProof proof;
  KVRAIL_ASSIGN_OR_RETURN(
      proof.room, ParseCanonicalUint(frames[1], 0, kMaxRoom, "sender proof frame 1 (room)"));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t rank,
                          ParseCanonicalUint(frames[2], 0, 1023, "sender proof frame 2 (rank)"));
  proof.prefill_rank = static_cast<uint32_t>(rank);
  if (frames[3].size() != kTagBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("sender proof frame 3 (tag) has ", frames[3].size(),
                                  " bytes, requires ", kTagBytes));
  }
  proof.tag = frames[3];
  return proof;
}

absl::StatusOr<std::vector<std::string>> BuildSenderProof(const SenderProof& proof) {
  std::vector<std::string> frames = {std::string(kSenderProofMagic), FormatUint(proof.room),
                                     FormatUint(proof.prefill_rank), proof.tag};
  if (absl::Status valid = ParseSenderProof(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build sender proof");
  }
  return frames;
}

absl::StatusOr<OwnerProof> ParseOwnerProof(absl::Span<const std::string> frames) {
  KVRAIL_RETURN_IF_ERROR(CheckShape(frames, kOwnerProofMagic, "owner proof", 4));
  OwnerProof proof;
  KVRAIL_ASSIGN_OR_RETURN(proof.room,
                          ParseCanonicalUint(frames[1], 0, kMaxRoom, "owner proof frame 1 (room)"));
  if (frames[2].empty() || frames[2].size() > kMaxSessionIdBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("owner proof frame 2 (session id) has ", frames[2].size(),
                                  " bytes, requires 1 to ", kMaxSessionIdBytes));
  }
  if (frames[3].size() != kSessionKeyBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("owner proof frame 3 (session key) has ", frames[3].size(),
                                  " bytes, requires ", kSessionKeyBytes));
  }
  proof.session_id = frames[2];
  proof.key = frames[3];
  return proof;
}

absl::StatusOr<std::vector<std::string>> BuildOwnerProof(const OwnerProof& proof) {
  std::vector<std::string> frames = {std::string(kOwnerProofMagic), FormatUint(proof.room),
                                     proof.session_id, proof.key};
  if (absl::Status valid = ParseOwnerProof(frames).status(); !valid.ok()) {
    return AddContext(valid, "cannot build owner proof");
  }
  return frames;
}

}  // namespace kvrail::wire
