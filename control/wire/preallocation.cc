#include "control/wire/preallocation.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/frame_text.h"
#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

constexpr absl::string_view kRoomWhat = "pre-allocation frame 0 (room)";
constexpr absl::string_view kSessionWhat = "pre-allocation frame 1 (session id)";
constexpr absl::string_view kManifestWhat = "pre-allocation frame 2 (manifest)";

absl::Status CheckManifestFrame(absl::string_view frame) {
  if (frame.size() <= kMaxManifestBytes) {
    return absl::OkStatus();
  }
  // A manifest rule (CACHEPD §5.1) checked at the frame: the reference raises it as a
  // manifest error, so it carries the manifest's category.
  return MakeError(ErrorCategory::kInvalidManifest,
                   absl::StrCat(kManifestWhat, ": ", frame.size(),
                                " bytes, must be empty (dummy target) or 1 to ", kMaxManifestBytes,
                                " (CACHEPD §3.3)"));
}

}  // namespace

bool operator==(const Preallocation& a, const Preallocation& b) {
  return a.room == b.room && a.session_id == b.session_id && a.manifest_wire == b.manifest_wire;
}

bool operator!=(const Preallocation& a, const Preallocation& b) { return !(a == b); }

bool operator==(const PreallocationRouteHeader& a, const PreallocationRouteHeader& b) {
  return a.room == b.room && a.session_id == b.session_id;
}

bool operator!=(const PreallocationRouteHeader& a, const PreallocationRouteHeader& b) {
  return !(a == b);
}

absl::StatusOr<PreallocationRouteHeader> ParsePreallocationRouteHeader(
    absl::Span<const std::string> frames) {
  if (frames.size() != kPreallocationFrameCount) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("pre-allocation: got ", frames.size(),
                                  " frames, requires exactly 3 (CACHEPD §3.3)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t room,
                          ParseCanonicalUint(frames[0], 0, kMaxRoom, kRoomWhat));
  KVRAIL_RETURN_IF_ERROR(RequireAscii(frames[1], kSessionWhat, "§3.3"));
  if (frames[1].empty() || frames[1].size() > kMaxSessionIdBytes) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat(kSessionWhat, ": ", frames[1].size(), " bytes, must be 1 to ",
                                  kMaxSessionIdBytes, " (CACHEPD §3.3)"));
  }
  return PreallocationRouteHeader{room, frames[1]};
}

absl::StatusOr<Preallocation> ParsePreallocation(absl::Span<const std::string> frames) {
  KVRAIL_ASSIGN_OR_RETURN(PreallocationRouteHeader header, ParsePreallocationRouteHeader(frames));
  KVRAIL_RETURN_IF_ERROR(CheckManifestFrame(frames[2]));
  return Preallocation{header.room, std::move(header.session_id), frames[2]};
}

absl::StatusOr<std::vector<std::string>> BuildPreallocation(const Preallocation& preallocation) {
  std::vector<std::string> frames = {FormatUint(preallocation.room), preallocation.session_id,
                                     preallocation.manifest_wire};
  // Checking the frames themselves keeps the builder from ever emitting what the parser rejects.
  absl::Status valid = ParsePreallocationRouteHeader(frames).status();
  if (valid.ok()) {
    valid = CheckManifestFrame(frames[2]);
  }
  if (!valid.ok()) {
    return AddContext(valid, "cannot build pre-allocation");
  }
  return frames;
}

}  // namespace kvrail::wire
