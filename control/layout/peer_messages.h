// Whole CachePD peer messages: the frame checks of control/wire joined with the contract and
// manifest parsers of this package, in the reference's order (CACHEPD §3.2, §3.3).
#ifndef KVRAIL_CONTROL_LAYOUT_PEER_MESSAGES_H_
#define KVRAIL_CONTROL_LAYOUT_PEER_MESSAGES_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"

namespace kvrail::layout {

// A registration whose contract (frame 5) parsed and passed §4.4.
struct DecodedRegistration {
  wire::Registration frames;
  Contract contract;
};

// Parses the 8 registration frames: frame errors are invalid-frame, contract errors are
// invalid-contract ("registration frame 5 (contract): ..."), in §3.2's order, so the
// nonzero-pointer check still comes after the contract. Last, the decode's arena [arena base,
// arena base + the contract's ArenaBytes) must end by 2^64 (invalid-frame; kvrail's own rule).
absl::StatusOr<DecodedRegistration> DecodeRegistration(absl::Span<const std::string> frames);

// A pre-allocation whose manifest (frame 2) parsed; nullopt manifest marks a dummy target.
struct DecodedPreallocation {
  wire::Preallocation frames;
  std::optional<Manifest> manifest;
};

// Parses the 3 pre-allocation frames. The manifest is parsed (§5.1) but not validated
// against a contract: that needs the registration's contract (§3.3 step 6).
absl::StatusOr<DecodedPreallocation> DecodePreallocation(absl::Span<const std::string> frames);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_PEER_MESSAGES_H_
