// The digest of a room's bytes for one destination (`--verify-digest`, docs/SECURITY.md,
// "Digests"): one definition, which the prefill computes over the source bytes it sends and the
// decode over the bytes that landed, so the two agree exactly when every byte landed where it
// was meant to.
//
// Definition: XXH3-64 (seed 0) of the concatenation, in ascending destination offset, of the
// bytes each copy of the room writes to that destination (one prefill rank to one decode
// session). Sorting by destination offset makes it independent of how the copies were
// coalesced, sliced, striped over lanes, and of the order the writes completed in: the same
// bytes give the same digest however the copy list was cut.
//
// Copies of one room to one destination never write a byte twice: fragments of one page are
// disjoint, and so are pages; only a destination manifest that names a page twice could make
// them overlap, and then what lands depends on which write came last. Such a room has no
// digest: RoomDigest refuses it.
//
// An integrity check against bugs and misrouted or torn writes, not against an attacker: XXH3
// is not cryptographic, and whoever can write the bytes could compute it. Authenticity is the
// sender proofs' (control/wire/proof.h).
//
// Pure: reads the arena it is given, nothing else.
#ifndef KVRAIL_CONTROL_PLAN_ROOM_DIGEST_H_
#define KVRAIL_CONTROL_PLAN_ROOM_DIGEST_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/base/copy_list.h"

namespace kvrail::plan {

// Which side of each copy the bytes are read from.
enum class DigestSide {
  kSource,       // the prefill: the bytes it sends, at each copy's src_offset
  kDestination,  // the decode: the bytes that landed, at each copy's dst_offset
};

// The room digest of `copies` over `arena` (the side's whole arena; offsets are relative to its
// base). A strided copy (rows > 1) counts as its rows, each a copy of its own. Sorts `copies` in
// place by destination offset (where strided copies' destination spans interleave, they are
// replaced by their rows first). Errors (invalid-argument): a copy that moves no byte, whose
// rows overlap, or that reaches past `arena` on `side` or past 2^64 (naming it); two that write
// a destination byte twice (naming both).
absl::StatusOr<uint64_t> RoomDigest(CopyList& copies, DigestSide side,
                                    absl::Span<const uint8_t> arena);

// "0x" and 16 hex digits, as errors and logs spell a digest.
std::string FormatDigest(uint64_t digest);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_ROOM_DIGEST_H_
