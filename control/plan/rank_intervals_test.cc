#include "control/plan/rank_intervals.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

layout::Partition Split(int64_t global_extent, std::vector<int64_t> parts = {}) {
  layout::Partition partition;
  partition.axis = 1;
  partition.global_extent = global_extent;
  partition.global_parts = std::move(parts);
  return partition;
}

TEST(ShardMapTest, OneShardPerRankWhenTpEqualsShards) {
  // 4 heads, 1 per rank, TP 4: k = 4, R = 1, every rank representative.
  absl::StatusOr<ShardMap> map = ShardMap::Create("layer.0.k", Split(4), 1, 4);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->distinct_shards(), 4);
  EXPECT_EQ(map->replica_group_size(), 1);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(map->IsRepresentative(r));
    EXPECT_EQ(map->Intervals(r), (std::vector<RankInterval>{{r, r + 1, 0}}));
  }
}

TEST(ShardMapTest, ReplicaGroupsShareAShardAndOnlyTheFirstRepresents) {
  // GQA: 4 KV heads over TP 8, 1 head per rank: k = 4, R = 2 (CACHEPD §6.5, gqa_kv4_p8_d2).
  absl::StatusOr<ShardMap> map = ShardMap::Create("layer.0.k", Split(4), 1, 8);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->replica_group_size(), 2);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(map->ShardOf(r), r / 2);
    EXPECT_EQ(map->IsRepresentative(r), r % 2 == 0);
    EXPECT_EQ(map->Interval(r, 0), (RankInterval{r / 2, r / 2 + 1, 0}));
  }
  EXPECT_EQ(map->RepresentativeOf(3), 6);
}

TEST(ShardMapTest, PartsSplitEachPartAcrossShards) {
  // §6.4 test_qkv_parts: global parts [4, 4, 8], local extent 8 at TP 2 (k = 2).
  absl::StatusOr<ShardMap> map = ShardMap::Create("layer.0.qkv", Split(16, {4, 4, 8}), 8, 2);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->part_count(), 3u);
  EXPECT_EQ(map->Intervals(0), (std::vector<RankInterval>{{0, 2, 0}, {4, 6, 2}, {8, 12, 4}}));
  EXPECT_EQ(map->Intervals(1), (std::vector<RankInterval>{{2, 4, 0}, {6, 8, 2}, {12, 16, 4}}));
}

TEST(ShardMapTest, UnpartitionedHolderSeesTheWholeExtent) {
  absl::StatusOr<ShardMap> map = ShardMap::Create("layer.0.k", Split(4), 4, 1);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->Intervals(0), (std::vector<RankInterval>{{0, 4, 0}}));
  EXPECT_EQ(map->Intervals(0)[0].length(), 4);
}

TEST(ShardMapTest, RefusesMoreShardsThanRanks) {
  absl::StatusOr<ShardMap> map = ShardMap::Create("layer.0.k", Split(4), 1, 3);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(CategoryOf(map.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_NE(map.status().message().find("'layer.0.k'"), absl::string_view::npos);
  EXPECT_NE(map.status().message().find("TP=3"), absl::string_view::npos);
  EXPECT_NE(map.status().message().find("CACHEPD §6.2"), absl::string_view::npos);
}

TEST(ShardMapTest, RefusesTpNotAMultipleOfShards) {
  // 6 heads, 3 per rank: k = 2 cannot spread over TP 3.
  absl::StatusOr<ShardMap> map = ShardMap::Create("layer.0.k", Split(6), 3, 3);
  ASSERT_FALSE(map.ok());
  EXPECT_EQ(CategoryOf(map.status()), ErrorCategory::kUnsupportedLayout);
  // ... but 6 heads, 2 per rank (k = 3) do.
  EXPECT_TRUE(ShardMap::Create("layer.0.k", Split(6), 2, 3).ok());
}

TEST(ShardMapTest, RefusesPartitionsAValidContractCannotCarry) {
  EXPECT_FALSE(ShardMap::Create("f", Split(4), 0, 1).ok());
  EXPECT_FALSE(ShardMap::Create("f", Split(6), 4, 1).ok());
  EXPECT_FALSE(ShardMap::Create("f", Split(4), 1, 0).ok());
  EXPECT_FALSE(ShardMap::Create("f", Split(8, {3, 5}), 4, 2).ok());
  EXPECT_FALSE(ShardMap::Create("f", Split(8, {2, 2}), 4, 2).ok());
}

}  // namespace
}  // namespace kvrail::plan
