// The staging offers a prefill holds (row staging, control/wire/row_staging.h): a decode's
// offer of a slot for a room comes right before the room's pre-allocation, and the room's
// first work to that session takes it (PrefillSidecar::BeginTransferLocked). Offers no room
// takes (the room never reaches this rank) are forgotten oldest first past the bound; a room
// whose offer was forgotten is written in place and answers nothing, which its decode, holding
// the slot, refuses (the room fails there; no byte is misplaced).
//
// Pure: no sockets, threads or clocks. Not thread-safe (the sidecar's owner thread alone uses it).
#ifndef KVRAIL_CONTROL_SIDECAR_STAGING_OFFERS_H_
#define KVRAIL_CONTROL_SIDECAR_STAGING_OFFERS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "control/wire/row_staging.h"

namespace kvrail::sidecar {

class StagingOffers {
 public:
  explicit StagingOffers(size_t bound = 4096) : bound_(bound) {}

  // Keeps `offer` for its (session, room), replacing one kept before; forgets the oldest past
  // the bound.
  void Keep(wire::StagingOffer offer);
  // The offer kept for (session, room), forgotten as it is taken.
  std::optional<wire::StagingOffer> Take(const std::string& session, uint64_t room);
  // Forgets every offer of `session` (it was dropped).
  void ForgetSession(const std::string& session);
  size_t size() const { return offers_.size(); }

 private:
  using Key = std::pair<std::string, uint64_t>;
  struct Kept {
    wire::StagingOffer offer;
    uint64_t sequence = 0;  // when it was kept: its entry in `order_`
  };
  size_t bound_;
  uint64_t next_sequence_ = 0;
  std::map<Key, Kept> offers_;
  // Oldest first; an entry whose sequence is not its key's kept one was taken or replaced.
  std::deque<std::pair<Key, uint64_t>> order_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_STAGING_OFFERS_H_
