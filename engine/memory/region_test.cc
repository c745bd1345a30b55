#include "engine/memory/region.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "engine/memory/arena.h"

namespace kvrail {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

RegionRecord Region(uint64_t base, uint64_t length) {
  return RegionRecord{base, length, MemoryKind::kHost, "r"};
}

TEST(ContainsTest, RangeInsideRegionIsContained) {
  EXPECT_TRUE(Contains(Region(0x1000, 0x100), 0x1010, 0x20));
}

TEST(ContainsTest, WholeRegionIsContained) {
  EXPECT_TRUE(Contains(Region(0x1000, 0x100), 0x1000, 0x100));
}

TEST(ContainsTest, RangeEndingExactlyAtRegionEndIsContained) {
  EXPECT_TRUE(Contains(Region(0x1000, 0x100), 0x10ff, 1));
  EXPECT_TRUE(Contains(Region(0x1000, 0x100), 0x1080, 0x80));
}

TEST(ContainsTest, RangeOneBytePastRegionEndIsNot) {
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0x10ff, 2));
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0x1100, 1));
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0x1000, 0x101));
}

TEST(ContainsTest, RangeStartingBeforeRegionIsNot) {
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0xfff, 1));
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0xfff, 0x10));
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0, 0x2000));
}

TEST(ContainsTest, RangeWhoseEndWrapsPast2To64IsNot) {
  // address + length wraps to 0x10, which a naive `address + length <= end` check would accept.
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), kMax - 0xf, 0x20));
  EXPECT_FALSE(Contains(Region(0x1000, 0x100), 0x1010, kMax));
  EXPECT_FALSE(Contains(Region(0, kMax), 1, kMax));
  EXPECT_FALSE(Contains(Region(kMax - 9, 10), kMax, 2));
}

TEST(ContainsTest, RegionAtTopOfAddressSpaceContainsItsLastByte) {
  // The region ends exactly at 2^64, which base + length cannot represent.
  const RegionRecord top = Region(kMax - 9, 10);
  EXPECT_TRUE(Contains(top, kMax - 9, 10));
  EXPECT_TRUE(Contains(top, kMax, 1));
  EXPECT_FALSE(Contains(top, kMax - 10, 1));
}

TEST(ContainsTest, WholeAddressSpaceButOneByte) {
  EXPECT_TRUE(Contains(Region(0, kMax), 0, kMax));
  EXPECT_TRUE(Contains(Region(0, kMax), kMax - 1, 1));
  EXPECT_FALSE(Contains(Region(0, kMax), kMax, 1));
}

TEST(ContainsTest, ZeroLengthRangeIsContainedFromBaseToExactEnd) {
  const RegionRecord region = Region(0x1000, 0x100);
  EXPECT_TRUE(Contains(region, 0x1000, 0));
  EXPECT_TRUE(Contains(region, 0x1100, 0));
  EXPECT_FALSE(Contains(region, 0x1101, 0));
  EXPECT_FALSE(Contains(region, 0xfff, 0));
}

TEST(ContainsTest, EmptyRegionContainsOnlyAnEmptyRangeAtItsBase) {
  const RegionRecord empty = Region(0x1000, 0);
  EXPECT_TRUE(Contains(empty, 0x1000, 0));
  EXPECT_FALSE(Contains(empty, 0x1000, 1));
  EXPECT_FALSE(Contains(empty, 0x1001, 0));
}

TEST(MemoryKindNameTest, NamesAreStable) {
  EXPECT_EQ(MemoryKindName(MemoryKind::kHost), "host");
  EXPECT_EQ(MemoryKindName(MemoryKind::kCuda), "cuda");
}

TEST(RecordOfTest, RecordsAnArenasMapping) {
  absl::StatusOr<Arena> arena = Arena::CreateMemfd("region-test", 8192);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const RegionRecord record = RecordOf(*arena);
  EXPECT_EQ(record.base, reinterpret_cast<uintptr_t>(arena->data()));
  EXPECT_EQ(record.length, 8192u);
  EXPECT_EQ(record.kind, MemoryKind::kHost);
  EXPECT_EQ(record.name, "memfd:region-test");
  EXPECT_TRUE(Contains(record, record.base + 8191, 1));
  EXPECT_FALSE(Contains(record, record.base + 8192, 1));
}

}  // namespace
}  // namespace kvrail
