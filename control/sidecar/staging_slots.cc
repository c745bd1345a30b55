#include "control/sidecar/staging_slots.h"

namespace kvrail::sidecar {

StagingSlots::StagingSlots(uint64_t bytes, uint64_t alignment)
    : bytes_(bytes), alignment_(alignment == 0 ? 1 : alignment) {}

std::optional<uint64_t> StagingSlots::Take(uint64_t bytes) {
  if (bytes == 0 || bytes > bytes_) return std::nullopt;
  const uint64_t need = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  if (need < bytes || need > bytes_) return std::nullopt;  // aligned up past the memory
  // First fit: the gap before each slot taken, then the gap after the last.
  uint64_t start = 0;
  for (const auto& [offset, length] : taken_) {
    if (offset - start >= need) break;
    start = offset + length;
  }
  if (start > bytes_ || bytes_ - start < need) return std::nullopt;
  taken_.emplace(start, need);
  taken_bytes_ += need;
  return start;
}

bool StagingSlots::Give(uint64_t offset) {
  auto found = taken_.find(offset);
  if (found == taken_.end()) return false;
  taken_bytes_ -= found->second;
  taken_.erase(found);
  return true;
}

}  // namespace kvrail::sidecar
