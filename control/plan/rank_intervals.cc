#include "control/plan/rank_intervals.h"

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::plan {

bool operator==(const RankInterval& a, const RankInterval& b) {
  return a.global_begin == b.global_begin && a.global_end == b.global_end &&
         a.local_offset == b.local_offset;
}

absl::StatusOr<ShardMap> ShardMap::Create(absl::string_view field_id,
                                          const layout::Partition& partition, int64_t local_extent,
                                          int tp_size) {
  const int64_t global = partition.global_extent;
  if (tp_size < 1) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     absl::StrCat("cannot map field '", field_id, "' to TP=", tp_size,
                                  ": TP sizes start at 1 (CACHEPD §6.1)"));
  }
  if (local_extent < 1 || global < local_extent || global % local_extent != 0) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     absl::StrCat("cannot map global extent ", global, " of field '", field_id,
                                  "': it is not a positive multiple of the local extent ",
                                  local_extent, " (CACHEPD §4.4, §6.2)"));
  }
  const int64_t shards = global / local_extent;
  if (shards > tp_size || tp_size % shards != 0) {
    return MakeError(
        ErrorCategory::kUnsupportedLayout,
        absl::StrCat("cannot map global extent ", global, " of field '", field_id,
                     "' to TP=", tp_size, ": local extent ", local_extent, " gives ", shards,
                     " distinct shards, which must divide the TP size (CACHEPD §6.2)"));
  }
  ShardMap map;
  map.tp_size_ = tp_size;
  map.distinct_shards_ = shards;
  map.replica_group_size_ = static_cast<int>(tp_size / shards);
  if (partition.global_parts.empty()) {
    map.part_extents_.push_back(global);
  } else {
    map.part_extents_ = partition.global_parts;
  }
  int64_t offset = 0;
  for (int64_t part : map.part_extents_) {
    if (part < 1 || part % shards != 0 || part > global - offset) {
      return MakeError(
          ErrorCategory::kUnsupportedLayout,
          absl::StrCat("cannot map field '", field_id, "': global part ", part,
                       " is not a positive multiple of ", shards,
                       " distinct shards inside global extent ", global, " (CACHEPD §4.4, §6.2)"));
    }
    map.part_global_begins_.push_back(offset);
    map.part_local_begins_.push_back(offset / shards);
    offset += part;
  }
  if (offset != global) {
    return MakeError(ErrorCategory::kUnsupportedLayout,
                     absl::StrCat("cannot map field '", field_id, "': global parts sum to ", offset,
                                  ", not the global extent ", global, " (CACHEPD §4.4)"));
  }
  return map;
}

RankInterval ShardMap::ShardInterval(int64_t shard, size_t part) const {
  // Every part is a multiple of k, so each part's local extent G_i / k is exact.
  const int64_t length = part_extents_[part] / distinct_shards_;
  const int64_t begin = part_global_begins_[part] + shard * length;
  return RankInterval{begin, begin + length, part_local_begins_[part]};
}

std::vector<RankInterval> ShardMap::Intervals(int rank) const {
  std::vector<RankInterval> out;
  out.reserve(part_count());
  for (size_t part = 0; part < part_count(); ++part) {
    out.push_back(Interval(rank, part));
  }
  return out;
}

}  // namespace kvrail::plan
