#include "control/layout/peer_messages.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
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
  // The arena [base, base + ArenaBytes) is where the prefill writes (§6.9); one that would pass
  // 2^64 is no arena any address can hold (kvrail strict rule: the reference never checks).
  // The base is nonzero (checked above) and ArenaBytes at most 2^52 (ValidateContract):
  // neither side of the comparison wraps.
  const uint64_t arena_bytes = static_cast<uint64_t>(contract->ArenaBytes());
  if (registration.arena_base - 1 > std::numeric_limits<uint64_t>::max() - arena_bytes) {
    return MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrFormat("registration frame 4 (arena base): 0x%x plus the contract's arena of %d "
                        "bytes passes 2^64 (kvrail strict rule)",
                        registration.arena_base, arena_bytes));
  }
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
