// The ranges a room stages (MergedRanges, CheckRanges) and HostArenaStaging, the memcpy staging
// behind --emulate-gpu-arena. CudaArenaStaging is cuda_arena_staging_test's.
#include "engine/memory/arena_staging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "engine/memory/host_arena_staging.h"

namespace kvrail {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MergedRangesTest, SortsMergesOverlappingAndTouchingAndDropsEmptyCopies) {
  const CopyList copies = {
      {100, 0, 10},  // [100, 110)
      {0, 50, 10},   // [0, 10)
      {105, 7, 20},  // [105, 125): overlaps the first
      {125, 9, 5},   // [125, 130): touches it
      {300, 1, 0},   // empty
      {10, 60, 4},   // [10, 14): touches [0, 10)
  };
  EXPECT_THAT(MergedRanges(copies, CopySide::kSource),
              ElementsAre(ByteRange{0, 14}, ByteRange{100, 30}));
  // The destination side: [0,10) [7,27) [9,14) [50,60) [60,64) -> [0,27) [50,64).
  EXPECT_THAT(MergedRanges(copies, CopySide::kDestination),
              ElementsAre(ByteRange{0, 27}, ByteRange{50, 14}));
  EXPECT_TRUE(MergedRanges(CopyList{}, CopySide::kSource).empty());
}

// Issue 31: a strided copy's rows that are apart on a side stay one range of rows there (one 2-D
// copy on a GPU), and one plain range where they are back to back.
TEST(MergedRangesTest, AStridedCopyIsOneRangeOfRowsWhereItsRowsAreApart) {
  CopyList copies = {{0, 4096, 512}};  // [0, 512) -> [4096, 4608)
  copies.push_back({512, 8192, 1024, /*rows=*/4, /*src_stride=*/1024, /*dst_stride=*/2048});
  EXPECT_THAT(MergedRanges(copies, CopySide::kSource),
              ElementsAre(ByteRange{0, 4608}));  // rows back to back: merged with the first
  EXPECT_THAT(MergedRanges(copies, CopySide::kDestination),
              ElementsAre(ByteRange{4096, 512}, ByteRange{8192, 1024, 4, 2048}));
}

TEST(CheckRangesTest, ARangeOfRowsIsCheckedOverItsWholeSpanAndItsRowsMustNotOverlap) {
  const std::vector<ByteRange> fits = {{0, 16, 4, 16}, {1, 15, 4, 16}};  // ends at 64
  EXPECT_TRUE(CheckRanges(fits, 64, "x").ok());
  const std::vector<ByteRange> past = {{2, 16, 4, 16}};
  EXPECT_THAT(std::string(CheckRanges(past, 64, "x").message()),
              HasSubstr("range 0 [2, 2+64) ends past the arena's 64 bytes"));
  const std::vector<ByteRange> overlapping = {{0, 16, 2, 8}};
  EXPECT_THAT(std::string(CheckRanges(overlapping, 64, "x").message()),
              HasSubstr("2 rows of 16 bytes 8 apart: rows must not overlap"));
  const std::vector<ByteRange> overflow = {{0, 16, UINT64_MAX, 1 << 20}};
  EXPECT_THAT(std::string(CheckRanges(overflow, 64, "x").message()), HasSubstr("overflow"));
}

TEST(CheckRangesTest, NamesTheFirstRangePastTheArenaAndAnOverflowingOne) {
  const std::vector<ByteRange> inside = {{0, 64}, {64, 0}, {10, 54}};
  EXPECT_TRUE(CheckRanges(inside, 64, "x").ok());
  const std::vector<ByteRange> past = {{0, 8}, {60, 5}};
  const absl::Status refused = CheckRanges(past, 64, "staging to the mirror");
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(refused.message()),
      HasSubstr("staging to the mirror: range 1 [60, 60+5) ends past the arena's 64 bytes"));
  const std::vector<ByteRange> overflow = {{UINT64_MAX - 2, 8}};
  EXPECT_FALSE(CheckRanges(overflow, 64, "x").ok());
}

class HostArenaStagingTest : public ::testing::Test {
 protected:
  HostArenaStagingTest() : arena_(256), mirror_(256, 0) {
    std::iota(arena_.begin(), arena_.end(), 0);
  }
  std::vector<uint8_t> arena_;
  std::vector<uint8_t> mirror_;
  HostArenaStaging staging_{arena_.data(), mirror_.data(), 256};
};

TEST_F(HostArenaStagingTest, ToMirrorCopiesExactlyTheRangesAtTheirOffsets) {
  const std::vector<ByteRange> ranges = {{4, 4}, {200, 56}};
  ASSERT_TRUE(staging_.ToMirror(ranges).ok());
  for (int i = 0; i < 256; ++i) {
    const bool inside = (i >= 4 && i < 8) || i >= 200;
    EXPECT_EQ(mirror_[i], inside ? arena_[i] : 0) << "byte " << i;
  }
}

TEST_F(HostArenaStagingTest, RowsGoToTheMirrorAndBackLeavingTheBytesBetweenThemAlone) {
  const std::vector<ByteRange> rows = {{8, 4, 3, 16}};  // [8,12) [24,28) [40,44)
  const auto inside = [](int i) { return i >= 8 && i < 44 && (i - 8) % 16 < 4; };
  ASSERT_TRUE(staging_.ToMirror(rows).ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(mirror_[i], inside(i) ? arena_[i] : 0) << "byte " << i;
  std::fill(mirror_.begin(), mirror_.end(), 0xEE);
  ASSERT_TRUE(staging_.FromMirror(rows).ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(arena_[i], inside(i) ? 0xEE : i) << "byte " << i;
}

TEST_F(HostArenaStagingTest, FromMirrorWritesOnlyTheRangesBack) {
  std::fill(mirror_.begin(), mirror_.end(), 0xEE);
  const std::vector<ByteRange> ranges = {{16, 16}};
  ASSERT_TRUE(staging_.FromMirror(ranges).ok());
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(arena_[i], (i >= 16 && i < 32) ? 0xEE : i) << "byte " << i;
  }
}

TEST_F(HostArenaStagingTest, ARangePastTheArenaCopiesNothingAtAll) {
  std::fill(mirror_.begin(), mirror_.end(), 0xEE);
  const std::vector<ByteRange> ranges = {{0, 16}, {250, 16}};
  const absl::Status refused = staging_.FromMirror(ranges);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("range 1 [250, 250+16)"));
  for (int i = 0; i < 256; ++i) EXPECT_EQ(arena_[i], i) << "byte " << i;  // not even range 0
  EXPECT_FALSE(staging_.ToMirror(ranges).ok());
  for (int i = 0; i < 256; ++i) EXPECT_EQ(mirror_[i], 0xEE) << "byte " << i;
}

}  // namespace
}  // namespace kvrail
