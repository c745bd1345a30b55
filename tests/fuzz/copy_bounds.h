// The property the registration -> plan -> resolve harnesses share: every copy a prefill's copy
// expansion produces lies inside both arenas. The data plane checks every write again before it
// posts it ("Bounds before bytes", docs/ARCHITECTURE.md); a copy plan that ever names a byte
// outside an arena is still a bug, and these checks end the process on one.
#ifndef KVRAIL_TESTS_FUZZ_COPY_BOUNDS_H_
#define KVRAIL_TESTS_FUZZ_COPY_BOUNDS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/session/prefill_rooms.h"
#include "engine/base/copy_list.h"

namespace kvrail::fuzz {

// Aborts, naming `what` and the copy, unless every copy moves at least one byte, every row of
// it (a strided copy's, rows that do not overlap) from inside [0, source_bytes) of the prefill's
// arena to inside [destination_base, destination_base + destination_bytes) of the decode's, a
// range that must not pass 2^64.
void CheckCopiesInArenas(const CopyList& copies, uint64_t source_bytes, uint64_t destination_base,
                         uint64_t destination_bytes, absl::string_view what);

// Aborts unless the data plane's own bounds check (transport::CheckWrites, as a transport that
// takes a strided copy whole runs it before any byte moves) accepts `pages` (a strided cursor's
// copies, already inside both arenas) against the decode arena as one region, and refuses them,
// naming the last, once the last one's last row reaches one byte past it.
void CheckTransportTakes(const CopyList& pages, uint64_t source_bytes, uint64_t destination_base,
                         uint64_t destination_bytes);

// Expands `plan` over (src, dst) into `copies` as the prefill sidecar does (ExpandCoalesced,
// control/sidecar/prefill_transfers.cc) and returns its status. When it succeeds, the copies
// are checked with CheckCopiesInArenas, and Expand followed by Coalesce, and a coalescing cursor
// read in small batches, must give the same list; so must a strided cursor's copies (each checked
// with CheckCopiesInArenas and CheckTransportTakes), row by row, merged. When it fails, nothing may
// be appended.
absl::Status ExpandAndCheck(const plan::CopyPlan& plan, const layout::Manifest& src,
                            const layout::Manifest& dst, uint64_t source_bytes,
                            uint64_t destination_base, uint64_t destination_bytes,
                            CopyList& copies);

// Every destination of a room's transfer, as the rooms layer handed it over: ExpandAndCheck
// against the prefill's contract and the destination's registration (arena base, contract).
// The rooms layer checked the manifests, so the expansion must succeed, and its copies must
// add up to the bytes the rooms layer planned for the destination.
void CheckTransfer(const session::TransferWork& work, const layout::Contract& prefill);

}  // namespace kvrail::fuzz

#endif  // KVRAIL_TESTS_FUZZ_COPY_BOUNDS_H_
