#include "engine/transport/bounds.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "engine/base/rows.h"

namespace kvrail::transport {

bool RangeInside(uint64_t address, uint64_t length, uint64_t base, uint64_t region_length) {
  // Written without `address + length` so that nothing can wrap.
  return address >= base && length <= region_length && address - base <= region_length - length;
}

absl::StatusOr<RemoteRegions> RemoteRegions::FromDescriptor(
    const v1::HandshakeDescriptor& descriptor) {
  std::vector<Entry> sorted;
  sorted.reserve(descriptor.regions_size());
  for (int i = 0; i < descriptor.regions_size(); ++i) {
    const v1::Region& region = descriptor.regions(i);
    if (region.length() == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("descriptor region %d: length is 0; a region must hold a byte", i));
    }
    if (region.length() - 1 > UINT64_MAX - region.base()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("descriptor region %d: base 0x%x + length %u passes 2^64", i,
                          region.base(), region.length()));
    }
    sorted.push_back(Entry{region.base(), region.length(), i});
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const Entry& a, const Entry& b) { return a.base < b.base; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const Entry& before = sorted[i - 1];
    const Entry& after = sorted[i];
    if (after.base - before.base < before.length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "descriptor regions %d and %d overlap at 0x%x; regions must be disjoint",
          std::min(before.index, after.index), std::max(before.index, after.index), after.base));
    }
  }
  return RemoteRegions(std::move(sorted));
}

std::optional<int> RemoteRegions::Find(uint64_t address, uint64_t length) const {
  // The only candidate is the last region whose base is <= address.
  auto it = std::upper_bound(sorted_.begin(), sorted_.end(), address,
                             [](uint64_t a, const Entry& e) { return a < e.base; });
  if (it == sorted_.begin()) return std::nullopt;
  --it;
  if (!RangeInside(address, length, it->base, it->length)) return std::nullopt;
  return it->index;
}

std::optional<int> RemoteRegions::FindStartingAt(uint64_t base, uint64_t length) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), base,
                             [](const Entry& e, uint64_t b) { return e.base < b; });
  if (it == sorted_.end() || it->base != base || it->length < length) return std::nullopt;
  return it->index;
}

absl::Status CheckLane(int lane, int lanes) {
  if (lane < 0 || lane >= lanes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lane %d is outside [0, %d), the transport's lanes", lane, lanes));
  }
  return absl::OkStatus();
}

absl::Status CheckDisjoint(const LocalRegion& region, RegionId registered_id,
                           uint64_t registered_base, uint64_t registered_length) {
  const uint64_t base = reinterpret_cast<uintptr_t>(region.base);
  const bool overlap = base <= registered_base ? registered_base - base < region.length
                                               : base - registered_base < registered_length;
  if (!overlap) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "local region [0x%x, +%u) overlaps registered region %d [0x%x, +%u); regions must be "
      "disjoint",
      base, region.length, registered_id, registered_base, registered_length));
}

absl::Status CheckPeerKind(const v1::HandshakeDescriptor& peer, v1::TransportKind kind,
                           absl::string_view name) {
  if (peer.transport() != kind) {
    return absl::InvalidArgumentError(
        absl::StrFormat("peer descriptor: transport is %s; this is the %s transport",
                        v1::TransportKind_Name(peer.transport()), name));
  }
  if (peer.lanes_size() == 0) {
    return absl::InvalidArgumentError("peer descriptor: no lanes; at least 1 is needed");
  }
  return absl::OkStatus();
}

absl::Status CheckLocalRegion(const LocalRegion& region, bool gpu_memory) {
  const auto base = reinterpret_cast<uintptr_t>(region.base);
  if (region.base == nullptr) {
    return absl::InvalidArgumentError("local region: base is null");
  }
  if (region.length == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("local region at 0x%x: length is 0; a region must hold a byte", base));
  }
  if (region.length - 1 > UINT64_MAX - base) {
    return absl::InvalidArgumentError(
        absl::StrFormat("local region at 0x%x: length %u passes 2^64", base, region.length));
  }
  if (region.cuda && !gpu_memory) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region at 0x%x: CUDA memory, which this transport cannot register", base));
  }
  return absl::OkStatus();
}

absl::Status CheckWrites(absl::Span<const Write> writes, uint64_t source_length,
                         const RemoteRegions& remote, const Capabilities& caps,
                         std::vector<int>* region_of) {
  if (writes.empty()) {
    return absl::InvalidArgumentError("batch has no writes; post at least one");
  }
  if (region_of != nullptr) region_of->clear();
  for (size_t i = 0; i < writes.size(); ++i) {
    const Write& w = writes[i];
    if (w.length == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %d of %d: length is 0; every write moves at least one byte", i, writes.size()));
    }
    if (w.rows == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %d of %d: 0 rows; every write moves at least one row", i, writes.size()));
    }
    if (w.rows > MaxRowsPerWrite(caps, w.length, w.remote_stride)) {
      if (caps.max_gather_rows <= 1) {
        return absl::InvalidArgumentError(
            absl::StrFormat("write %d of %d: %u rows; this transport takes one row a write", i,
                            writes.size(), w.rows));
      }
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %d of %d: %u rows of %u bytes landing %u apart; this transport takes rows only "
          "gathered into contiguous bytes at the peer (a destination stride equal to the "
          "length), at most %u a write",
          i, writes.size(), w.rows, w.length, w.remote_stride, caps.max_gather_rows));
    }
    if (w.rows > 1 && (w.local_stride < w.length || w.remote_stride < w.length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %d of %d: strides %u (source) and %u (destination) below the row length %u; "
          "rows must not overlap",
          i, writes.size(), w.local_stride, w.remote_stride, w.length));
    }
    RowsMeasure m;
    if (!MeasureRows(w.rows, w.length, w.local_stride, w.remote_stride, &m)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("write %d of %d: %u rows of %u bytes at strides %u and %u pass 2^64", i,
                          writes.size(), w.rows, w.length, w.local_stride, w.remote_stride));
    }
    if (m.payload > caps.max_write_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("write %d of %d: %u bytes exceed the transport's max_write_bytes %u", i,
                          writes.size(), m.payload, caps.max_write_bytes));
    }
    if (!RangeInside(w.local_offset, m.span_a, 0, source_length)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %d of %d: source [%u, +%u) lies outside the source region's %u bytes", i,
          writes.size(), w.local_offset, m.span_a, source_length));
    }
    const std::optional<int> region = remote.Find(w.remote_address, m.span_b);
    if (!region.has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "write %d of %d: destination [0x%x, +%u) lies inside none of the peer's %d regions", i,
          writes.size(), w.remote_address, m.span_b, remote.size()));
    }
    if (region_of != nullptr) region_of->push_back(*region);
  }
  return absl::OkStatus();
}

}  // namespace kvrail::transport
