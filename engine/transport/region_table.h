// A transport's own registrations, in one place for every backend (ucx/, verbs/, loopback/): the
// ids Register hands out, each registered range, the overlap check a new registration passes,
// the lookups a post (by id) and a target (by address, "Bounds before bytes") make, and the
// descriptor version that every Register and Deregister raises (transport.h).
//
// `Entry` is what the backend keeps for a registration (UCX's memory handle and packed rkey,
// verbs' MRs, loopback's pinned entry). The table holds no lock: the backend guards it as it
// guarded its own map, and says which of its locks do. Whether a deregistered region is still
// in use (a batch sending from it, a peer's write landing in it) stays the backend's to settle:
// Remove hands the entry back so that the backend can wait for it or revoke it.
#ifndef KVRAIL_ENGINE_TRANSPORT_REGION_TABLE_H_
#define KVRAIL_ENGINE_TRANSPORT_REGION_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"

namespace kvrail::transport {

// NotFound, "Deregister: region <id> is not registered": what every backend's Deregister says
// of an id it does not hold.
absl::Status RegionNotRegistered(RegionId region);

template <typename Entry>
class RegionTable {
 public:
  struct Registered {
    uint64_t base = 0;
    uint64_t length = 0;
    Entry entry;
  };
  using Map = std::map<RegionId, Registered>;

  // InvalidArgument, naming both (bounds.h CheckDisjoint), when `region` overlaps a registered
  // region; the first such region in id order is named.
  absl::Status CheckDisjoint(const LocalRegion& region) const {
    for (const auto& [id, registered] : by_id_) {
      absl::Status status =
          transport::CheckDisjoint(region, id, registered.base, registered.length);
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // Records [base, base + length) under a new id (ids are never reused) and raises the version.
  // The caller checked the range (CheckLocalRegion, CheckDisjoint).
  RegionId Add(uint64_t base, uint64_t length, Entry entry) {
    const RegionId id = next_id_++;
    by_id_.emplace(id, Registered{base, length, std::move(entry)});
    by_base_.emplace(base, id);
    ++version_;
    return id;
  }

  // The registration `id`, or null.
  Registered* Find(RegionId id) {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &it->second;
  }
  const Registered* Find(RegionId id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &it->second;
  }

  // The id of the registration that holds all of [address, address + length), or nullopt; a
  // range straddling two adjacent registrations is held by neither, one past 2^64 by none.
  std::optional<RegionId> Covering(uint64_t address, uint64_t length) const {
    // Registrations are disjoint: the only candidate is the last one starting at or before
    // `address`.
    auto it = by_base_.upper_bound(address);
    if (it == by_base_.begin()) return std::nullopt;
    --it;
    const Registered& registered = by_id_.at(it->second);
    if (!RangeInside(address, length, registered.base, registered.length)) return std::nullopt;
    return it->second;
  }

  // Withdraws `id` and raises the version; its entry is the caller's again.
  // RegionNotRegistered for an unknown id (nothing changes).
  absl::StatusOr<Entry> Remove(RegionId id) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return RegionNotRegistered(id);
    Entry entry = std::move(it->second.entry);
    by_base_.erase(it->second.base);
    by_id_.erase(it);
    ++version_;
    return entry;
  }

  // Every entry, in id order, leaving the table empty (Close). The version is unchanged: a
  // closed transport publishes no descriptor.
  std::vector<Entry> TakeAll() {
    std::vector<Entry> entries;
    entries.reserve(by_id_.size());
    for (auto& [id, registered] : by_id_) entries.push_back(std::move(registered.entry));
    by_id_.clear();
    by_base_.clear();
    return entries;
  }

  // Starts at 1; raised by every Add and Remove (the descriptor's `version`).
  uint64_t version() const { return version_; }
  size_t size() const { return by_id_.size(); }
  bool empty() const { return by_id_.empty(); }
  // In id order (the descriptor lists regions so).
  typename Map::const_iterator begin() const { return by_id_.begin(); }
  typename Map::const_iterator end() const { return by_id_.end(); }
  typename Map::iterator begin() { return by_id_.begin(); }
  typename Map::iterator end() { return by_id_.end(); }

 private:
  Map by_id_;
  std::map<uint64_t, RegionId> by_base_;  // disjoint ranges, by their first byte
  RegionId next_id_ = 1;
  uint64_t version_ = 1;
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_REGION_TABLE_H_
