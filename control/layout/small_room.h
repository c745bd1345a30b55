// Test support: the small contract the sidecar's tests attach and a room's manifest over it.
#ifndef KVRAIL_CONTROL_LAYOUT_SMALL_ROOM_H_
#define KVRAIL_CONTROL_LAYOUT_SMALL_ROOM_H_

#include <cstdint>
#include <vector>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"

namespace kvrail::layout::testing {

// Two layers of k and v, 16 pages, TP 1.
Contract SmallContract();

// The manifest of a room over `blocks` (16 tokens each, no prefix).
Manifest RoomManifest(const Contract& contract, std::vector<int64_t> blocks);

}  // namespace kvrail::layout::testing

#endif  // KVRAIL_CONTROL_LAYOUT_SMALL_ROOM_H_
