// Decode, staged arena (arena_staging.cc): which rooms have a copy back to the arena running,
// and the page releases that wait for it. Failed means fenced: a room's pages may go back to
// the engine only once every prefill rank answered its fence (DecodeRooms) and no copy of the
// staging into them is running any more. Pure bookkeeping, guarded by the sidecar's mu.
#ifndef KVRAIL_CONTROL_SIDECAR_STAGING_HOLDS_H_
#define KVRAIL_CONTROL_SIDECAR_STAGING_HOLDS_H_

#include <cstdint>
#include <map>
#include <vector>

#include "control/session/room_output.h"

namespace kvrail::sidecar {

class StagingHolds {
 public:
  // A copy back into `room`'s pages begins.
  void Begin(uint64_t room);
  // A release of `room`'s pages: kept (true) while a copy into them runs, else false and the
  // caller publishes it now.
  bool Hold(const session::PagesRelease& release);
  // A copy into `room`'s pages has returned: the releases that waited for the room's last
  // running copy, in the order they came (none while another copy still runs).
  std::vector<session::PagesRelease> End(uint64_t room);

  // Rooms with a copy running (for tests and stats).
  size_t rooms() const { return running_.size(); }

 private:
  std::map<uint64_t, int> running_;  // room -> copies running
  std::map<uint64_t, std::vector<session::PagesRelease>> held_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_STAGING_HOLDS_H_
