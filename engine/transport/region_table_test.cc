#include "engine/transport/region_table.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

LocalRegion At(uint64_t base, uint64_t length) {
  return LocalRegion{.base = reinterpret_cast<void*>(base), .length = length};
}

TEST(RegionTableTest, IdsStartAtOneAndAreNeverReused) {
  RegionTable<std::string> table;
  const RegionId a = table.Add(0x1000, 0x100, "a");
  const RegionId b = table.Add(0x2000, 0x100, "b");
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);
  ASSERT_TRUE(table.Remove(b).ok());
  EXPECT_EQ(table.Add(0x2000, 0x100, "c"), 3u);
}

TEST(RegionTableTest, EveryAddAndRemoveRaisesTheVersion) {
  RegionTable<int> table;
  EXPECT_EQ(table.version(), 1u);
  const RegionId id = table.Add(0x1000, 16, 7);
  EXPECT_EQ(table.version(), 2u);
  ASSERT_TRUE(table.Remove(id).ok());
  EXPECT_EQ(table.version(), 3u);
}

TEST(RegionTableTest, RemoveHandsTheEntryBack) {
  RegionTable<std::string> table;
  const RegionId id = table.Add(0x1000, 16, "memory handle");
  absl::StatusOr<std::string> entry = table.Remove(id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(*entry, "memory handle");
  EXPECT_EQ(table.Find(id), nullptr);
  EXPECT_TRUE(table.empty());
}

TEST(RegionTableTest, AnUnknownIdIsNotFoundAndChangesNothing) {
  RegionTable<int> table;
  table.Add(0x1000, 16, 1);
  const absl::StatusOr<int> removed = table.Remove(9);
  EXPECT_EQ(removed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(removed.status().message(), "Deregister: region 9 is not registered");
  EXPECT_EQ(table.version(), 2u);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.Find(9), nullptr);
}

TEST(RegionTableTest, FindGivesTheRegisteredRange) {
  RegionTable<int> table;
  const RegionId id = table.Add(0x1000, 0x80, 5);
  const auto* found = table.Find(id);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->base, 0x1000u);
  EXPECT_EQ(found->length, 0x80u);
  EXPECT_EQ(found->entry, 5);
}

TEST(RegionTableTest, AnOverlappingRegionIsRefusedNamingTheRegionItOverlaps) {
  RegionTable<int> table;
  table.Add(0x1000, 0x100, 1);
  const RegionId second = table.Add(0x2000, 0x100, 2);
  const absl::Status status = table.CheckDisjoint(At(0x20f0, 0x20));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(std::to_string(second)), std::string::npos) << status;
  EXPECT_EQ(table.CheckDisjoint(At(0x1000, 1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegionTableTest, AdjacentRegionsAreDisjoint) {
  RegionTable<int> table;
  table.Add(0x1000, 0x100, 1);
  EXPECT_TRUE(table.CheckDisjoint(At(0x1100, 0x100)).ok());
  EXPECT_TRUE(table.CheckDisjoint(At(0xf00, 0x100)).ok());
}

TEST(RegionTableTest, CoveringFindsTheRegionHoldingAWholeRangeUpToItsLastByte) {
  RegionTable<int> table;
  const RegionId a = table.Add(0x1000, 0x100, 1);
  const RegionId b = table.Add(0x1100, 0x100, 2);
  EXPECT_EQ(table.Covering(0x1000, 0x100), a);
  EXPECT_EQ(table.Covering(0x10ff, 1), a);
  EXPECT_EQ(table.Covering(0x1100, 0x100), b);
  EXPECT_EQ(table.Covering(0x11ff, 1), b);
}

TEST(RegionTableTest, CoveringRefusesRangesOutsideStraddlingOrWrapping) {
  RegionTable<int> table;
  table.Add(0x1000, 0x100, 1);
  table.Add(0x1100, 0x100, 2);
  table.Add(UINT64_MAX - 0xff, 0x100, 3);
  EXPECT_EQ(table.Covering(0xfff, 1), std::nullopt);                // before the first
  EXPECT_EQ(table.Covering(0x10ff, 2), std::nullopt);               // straddles two
  EXPECT_EQ(table.Covering(0x1200, 1), std::nullopt);               // past the last byte
  EXPECT_EQ(table.Covering(0x1000, 0x201), std::nullopt);           // longer than any
  EXPECT_EQ(table.Covering(UINT64_MAX - 0xf, 0x20), std::nullopt);  // would wrap past 2^64
  EXPECT_TRUE(table.Covering(UINT64_MAX, 1).has_value());
}

TEST(RegionTableTest, ARemovedRegionCoversNothing) {
  RegionTable<int> table;
  const RegionId id = table.Add(0x1000, 0x100, 1);
  ASSERT_TRUE(table.Remove(id).ok());
  EXPECT_EQ(table.Covering(0x1000, 1), std::nullopt);
  EXPECT_TRUE(table.CheckDisjoint(At(0x1000, 0x100)).ok());
}

TEST(RegionTableTest, TakeAllEmptiesTheTableInIdOrder) {
  RegionTable<int> table;
  table.Add(0x3000, 16, 30);
  table.Add(0x1000, 16, 10);
  const std::vector<int> entries = table.TakeAll();
  EXPECT_EQ(entries, (std::vector<int>{30, 10}));
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.Covering(0x1000, 1), std::nullopt);
}

TEST(RegionTableTest, IterationIsInIdOrder) {
  RegionTable<int> table;
  table.Add(0x3000, 16, 1);
  table.Add(0x1000, 16, 2);
  table.Add(0x2000, 16, 3);
  std::vector<RegionId> ids;
  for (const auto& [id, registered] : table) ids.push_back(id);
  EXPECT_EQ(ids, (std::vector<RegionId>{1, 2, 3}));
}

}  // namespace
}  // namespace kvrail::transport
