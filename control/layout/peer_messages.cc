#include "control/layout/peer_messages.h"

#include <utility>

#include "engine/base/error.h"

namespace kvrail::layout {

absl::StatusOr<DecodedRegistration> DecodeRegistration(absl::Span<const std::string> frames) {
  std::optional<Contract> contract;
  KVRAIL_ASSIGN_OR_RETURN(
      wire::Registration registration,
      wire::ParseRegistration(frames, [&contract](absl::string_view wire) -> absl::Status {
        absl::StatusOr<Contract> parsed = ParseContract(wire);
        if (!parsed.ok()) return parsed.status();
        contract = *std::move(parsed);
        return absl::OkStatus();
      }));
  return DecodedRegistration{std::move(registration), *std::move(contract)};
}

absl::StatusOr<DecodedPreallocation> DecodePreallocation(absl::Span<const std::string> frames) {
  KVRAIL_ASSIGN_OR_RETURN(wire::Preallocation preallocation, wire::ParsePreallocation(frames));
  DecodedPreallocation out{std::move(preallocation), std::nullopt};
  if (!out.frames.is_dummy()) {
    absl::StatusOr<Manifest> manifest = ParseManifest(out.frames.manifest_wire);
    if (!manifest.ok()) {
      return AddContext(manifest.status(), "pre-allocation frame 2 (manifest)");
    }
    out.manifest = *std::move(manifest);
  }
  return out;
}

}  // namespace kvrail::layout
