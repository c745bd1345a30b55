// Rank intervals of a partitioned field (CACHEPD §6.2, the reference's `_rank_partitions`):
// which global slice of a field's partition axis each TP rank of one side holds, and where that
// slice sits in the rank's local page.
#ifndef KVRAIL_CONTROL_PLAN_RANK_INTERVALS_H_
#define KVRAIL_CONTROL_PLAN_RANK_INTERVALS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"

namespace kvrail::plan {

// One part of what a rank holds along the partition axis: the global interval
// [global_begin, global_end), stored at element `local_offset` of the rank's local extent.
struct RankInterval {
  int64_t global_begin = 0;
  int64_t global_end = 0;
  int64_t local_offset = 0;

  int64_t length() const { return global_end - global_begin; }
};

bool operator==(const RankInterval& a, const RankInterval& b);

// How one side's TP ranks share a partitioned field. With global extent G, local extent L and
// TP size T: k = G / L distinct shards, replica groups of R = T / k ranks holding identical
// data, and rank r holding shard s = r / R. Part i of extent G_i (parts default to [G]) gives
// shard s the global interval [off_i + s * G_i / k, off_i + (s + 1) * G_i / k) at local offset
// sum_{j<i} G_j / k, where off_i = sum_{j<i} G_j.
//
// A ShardMap is a small value; its accessors do no allocation except Intervals().
class ShardMap {
 public:
  // Maps `partition` of field `field_id`, whose rank-local extent on the partition axis is
  // `local_extent`, onto a side with TP size `tp_size`. Requires k <= tp_size and
  // tp_size % k == 0 (§6.2 step 2), else an unsupported-layout error naming the field, both
  // extents and the TP size. Also refuses, as unsupported-layout, a partition that a validated
  // contract cannot carry (§4.4): tp_size < 1, local_extent < 1, G not a positive multiple of
  // L, a part that is not a positive multiple of k, parts that do not sum to G.
  static absl::StatusOr<ShardMap> Create(absl::string_view field_id,
                                         const layout::Partition& partition, int64_t local_extent,
                                         int tp_size);

  int tp_size() const { return tp_size_; }
  // k, the number of distinct shards.
  int64_t distinct_shards() const { return distinct_shards_; }
  // R = T / k, the size of a group of ranks holding the same shard.
  int replica_group_size() const { return replica_group_size_; }
  // The number of parts: global_parts.size(), or 1 when global_parts is empty.
  size_t part_count() const { return part_extents_.size(); }

  // s = rank / R. Requires 0 <= rank < tp_size().
  int64_t ShardOf(int rank) const { return rank / replica_group_size_; }
  // rank % R == 0: the first rank of its replica group. Only representative prefill ranks are
  // sources of a partitioned field (§6.2).
  bool IsRepresentative(int rank) const { return rank % replica_group_size_ == 0; }
  // The first rank holding `shard`: shard * R. Requires 0 <= shard < k.
  int RepresentativeOf(int64_t shard) const {
    return static_cast<int>(shard) * replica_group_size_;
  }

  // The interval of part `part` that shard `shard` holds. Requires 0 <= shard < k and
  // part < part_count().
  RankInterval ShardInterval(int64_t shard, size_t part) const;
  // The interval of part `part` that rank `rank` holds. Requires 0 <= rank < tp_size().
  RankInterval Interval(int rank, size_t part) const { return ShardInterval(ShardOf(rank), part); }
  // Every part's interval for `rank`, in part order (§6.2 step 4).
  std::vector<RankInterval> Intervals(int rank) const;

 private:
  ShardMap() = default;

  int tp_size_ = 1;
  int64_t distinct_shards_ = 1;
  int replica_group_size_ = 1;
  std::vector<int64_t> part_extents_;        // G_i
  std::vector<int64_t> part_global_begins_;  // off_i
  std::vector<int64_t> part_local_begins_;   // sum_{j<i} G_j / k
};

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_RANK_INTERVALS_H_
