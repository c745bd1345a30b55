#include "engine/memory/region.h"

#include "engine/memory/arena.h"

namespace kvrail {

absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

bool RegionRecord::operator==(const RegionRecord& other) const {
  return base == other.base && length == other.length && kind == other.kind && name == other.name;
}

RegionRecord RecordOf(const Arena& arena) {
  return RegionRecord{reinterpret_cast<uintptr_t>(arena.data()), arena.size(), arena.kind(),
                      arena.name()};
}

bool Contains(const RegionRecord& region, uint64_t address, uint64_t length) {
  // Subtractions only: each operand is checked first, so none can wrap. The region itself may
  // end exactly at 2^64 (base + length is never computed).
  if (address < region.base) return false;
  if (length > region.length) return false;
  return address - region.base <= region.length - length;
}

}  // namespace kvrail
