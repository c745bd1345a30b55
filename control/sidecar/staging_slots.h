// A decode's row staging memory, cut into slots (row staging, control/wire/row_staging.h): a
// slot per (room, prefill rank) it offers, first fit, each starting at a multiple of the
// alignment. A slot comes back when its rows were scattered into the pages, when its prefill
// rank wrote in place instead, or when its room's pages were released (after the room's fence:
// no write of the room can land in the slot any more).
//
// Pure: no sockets, threads or clocks. Not thread-safe (the sidecar's owner thread alone uses it).
#ifndef KVRAIL_CONTROL_SIDECAR_STAGING_SLOTS_H_
#define KVRAIL_CONTROL_SIDECAR_STAGING_SLOTS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace kvrail::sidecar {

class StagingSlots {
 public:
  // Offsets [0, bytes), slots starting at multiples of `alignment` (a power of two).
  StagingSlots(uint64_t bytes, uint64_t alignment = 4096);

  // The offset of a free slot of `bytes` (first fit), now taken; nullopt when none is free (or
  // `bytes` is 0).
  std::optional<uint64_t> Take(uint64_t bytes);
  // Gives back the slot taken at `offset`; false (nothing changes) for an offset no slot holds.
  bool Give(uint64_t offset);

  uint64_t bytes() const { return bytes_; }
  uint64_t taken_bytes() const { return taken_bytes_; }
  size_t taken() const { return taken_.size(); }

 private:
  uint64_t bytes_;
  uint64_t alignment_;
  uint64_t taken_bytes_ = 0;
  std::map<uint64_t, uint64_t> taken_;  // offset -> bytes (aligned up)
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_STAGING_SLOTS_H_
