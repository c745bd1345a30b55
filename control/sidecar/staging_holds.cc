#include "control/sidecar/staging_holds.h"

#include <utility>

namespace kvrail::sidecar {

void StagingHolds::Begin(uint64_t room) { ++running_[room]; }

bool StagingHolds::Hold(const session::PagesRelease& release) {
  if (running_.count(release.room) == 0) return false;
  held_[release.room].push_back(release);
  return true;
}

std::vector<session::PagesRelease> StagingHolds::End(uint64_t room) {
  auto running = running_.find(room);
  if (running == running_.end() || --running->second > 0) return {};
  running_.erase(running);
  auto held = held_.find(room);
  if (held == held_.end()) return {};
  std::vector<session::PagesRelease> releases = std::move(held->second);
  held_.erase(held);
  return releases;
}

}  // namespace kvrail::sidecar
