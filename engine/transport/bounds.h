// "Bounds before bytes" (docs/ARCHITECTURE.md): the checks every backend runs on a whole batch
// before it moves a single byte, and on every region before it registers or connects.
//
// All range arithmetic is overflow-safe: a range whose end would pass 2^64 is never inside
// anything.
#ifndef KVRAIL_ENGINE_TRANSPORT_BOUNDS_H_
#define KVRAIL_ENGINE_TRANSPORT_BOUNDS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/transport/transport.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

// True when [address, address + length) lies within [base, base + region_length). A range may
// end exactly at the region's end; a range that wraps past 2^64 is never inside.
bool RangeInside(uint64_t address, uint64_t length, uint64_t base, uint64_t region_length);

// The regions of one peer's descriptor, sorted for lookup. Built once per Connect.
class RemoteRegions {
 public:
  // Rejects (InvalidArgument, naming the region index) a region of length 0, one whose end
  // passes 2^64, and two regions that overlap. A descriptor with no regions is valid: every
  // write to it is rejected.
  static absl::StatusOr<RemoteRegions> FromDescriptor(const v1::HandshakeDescriptor& descriptor);

  // The index in the descriptor's `regions` of the one region that holds all of
  // [address, address + length), or nullopt. A range that straddles two adjacent regions is
  // held by neither.
  std::optional<int> Find(uint64_t address, uint64_t length) const;

  // The index of the region that begins exactly at `base` and holds at least `length` bytes,
  // or nullopt (a base inside a region, or past its end, is not its beginning).
  std::optional<int> FindStartingAt(uint64_t base, uint64_t length) const;

  int size() const { return static_cast<int>(sorted_.size()); }

 private:
  struct Entry {
    uint64_t base;
    uint64_t length;
    int index;  // in the descriptor
  };
  explicit RemoteRegions(std::vector<Entry> sorted) : sorted_(std::move(sorted)) {}

  std::vector<Entry> sorted_;  // by base; no two overlap
};

// InvalidArgument unless 0 <= lane < lanes.
absl::Status CheckLane(int lane, int lanes);

// Checks a local region before registration: InvalidArgument for a null base, a zero length, an
// end past 2^64, or CUDA memory when `gpu_memory` is false.
absl::Status CheckLocalRegion(const LocalRegion& region, bool gpu_memory);

// InvalidArgument, naming both, when the local region `region` overlaps `registered` (already
// registered as `registered_id`): a transport's registrations must be disjoint.
absl::Status CheckDisjoint(const LocalRegion& region, RegionId registered_id,
                           uint64_t registered_base, uint64_t registered_length);

// The checks every backend's Connect starts with: InvalidArgument when `peer` is of another
// transport kind than `kind` (this backend, named `name`) or has no lanes.
absl::Status CheckPeerKind(const v1::HandshakeDescriptor& peer, v1::TransportKind kind,
                           absl::string_view name);

// Checks a whole batch before any byte moves. InvalidArgument, naming the first bad write by
// index, for: an empty batch; a write of length 0, or of 0 rows, or moving more than `caps`'
// max_write_bytes; a write of more rows than MaxRowsPerWrite allows on `caps`, or with a stride
// below its length; a source span (every row's bytes) outside [0, source_length); a destination
// span not inside one of `remote`'s regions. Overflow-safe. With `region_of`, on success it holds
// each write's region index (RemoteRegions::Find), so a backend posting the batch need not look
// them up again.
absl::Status CheckWrites(absl::Span<const Write> writes, uint64_t source_length,
                         const RemoteRegions& remote, const Capabilities& caps,
                         std::vector<int>* region_of = nullptr);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_BOUNDS_H_
