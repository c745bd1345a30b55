// A room's copies with their destination packed (issue 31, row staging: control/wire/
// row_staging.h): the same source bytes in the same order, each row landing right after the one
// before, from destination offset 0. A prefill writes a head-sliced room into a decode's staging
// slot this way (one contiguous run instead of rows landing apart), and the decode scatters the
// run into its pages in the same order (control/plan/landing_copies.h).
#ifndef KVRAIL_ENGINE_BASE_PACKED_DESTINATION_H_
#define KVRAIL_ENGINE_BASE_PACKED_DESTINATION_H_

#include <memory>

#include "engine/base/copy_source.h"

namespace kvrail {

// Rewrites copies[0, n) in place, each destination packed: a copy's rows land back to back at
// `cursor` (the bytes before them), which moves past them. A copy whose rows are back to back on
// the source too becomes one plain copy, and merges with the copy before it where both sides
// continue it; empty copies go. Returns how many copies are left, at the front.
size_t PackDestinations(Copy* copies, size_t n, uint64_t& cursor);

// A list's copies packed from destination offset 0, in place.
void PackDestinations(CopyList& copies);

// `inner`'s copies packed as they are pulled, from destination offset 0. The envelope: the inner
// source side, the destination [0, bytes), `bytes` and `copies` unchanged.
std::unique_ptr<CopySource> PackDestination(std::unique_ptr<CopySource> inner);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_BASE_PACKED_DESTINATION_H_
