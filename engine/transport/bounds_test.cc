#include "engine/transport/bounds.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/transport/transport.h"
#include "gtest/gtest.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {
namespace {

v1::HandshakeDescriptor DescriptorOf(const std::vector<std::pair<uint64_t, uint64_t>>& regions) {
  v1::HandshakeDescriptor descriptor;
  for (const auto& [base, length] : regions) {
    v1::Region* region = descriptor.add_regions();
    region->set_base(base);
    region->set_length(length);
  }
  return descriptor;
}

RemoteRegions RegionsOf(const std::vector<std::pair<uint64_t, uint64_t>>& regions) {
  return RemoteRegions::FromDescriptor(DescriptorOf(regions)).value();
}

TEST(RangeInsideTest, AcceptsRangesEndingExactlyAtTheRegionEnd) {
  EXPECT_TRUE(RangeInside(100, 50, 100, 50));
  EXPECT_TRUE(RangeInside(149, 1, 100, 50));
  EXPECT_FALSE(RangeInside(149, 2, 100, 50));
  EXPECT_FALSE(RangeInside(99, 1, 100, 50));
}

TEST(RangeInsideTest, NeverWrapsPast2To64) {
  EXPECT_TRUE(RangeInside(UINT64_MAX - 9, 10, UINT64_MAX - 9, 10));
  EXPECT_FALSE(RangeInside(UINT64_MAX - 9, 11, UINT64_MAX - 9, 10));
  EXPECT_FALSE(RangeInside(100, UINT64_MAX, 0, 200));
  EXPECT_FALSE(RangeInside(UINT64_MAX, 2, 0, UINT64_MAX));
}

TEST(RemoteRegionsTest, FindsTheRegionHoldingARangeByDescriptorIndex) {
  const RemoteRegions regions = RegionsOf({{5000, 1000}, {1000, 1000}, {3000, 500}});
  EXPECT_EQ(regions.Find(1000, 1000), 1);
  EXPECT_EQ(regions.Find(3100, 400), 2);
  EXPECT_EQ(regions.Find(5999, 1), 0);
  EXPECT_EQ(regions.Find(999, 1), std::nullopt);
  EXPECT_EQ(regions.Find(2000, 1), std::nullopt);
  EXPECT_EQ(regions.Find(6000, 1), std::nullopt);
}

// A registration's arena base must be where a region begins (issue: a forged base two pages
// into another decode's region).
TEST(RemoteRegionsTest, FindStartingAtWantsTheRegionsOwnBase) {
  const RemoteRegions regions = RegionsOf({{5000, 1000}, {1000, 1000}});
  EXPECT_EQ(regions.FindStartingAt(1000, 1000), 1);
  EXPECT_EQ(regions.FindStartingAt(5000, 10), 0);
  EXPECT_EQ(regions.FindStartingAt(1000, 1001), std::nullopt);  // does not hold the arena
  EXPECT_EQ(regions.FindStartingAt(1008, 8), std::nullopt);     // inside, not its beginning
  EXPECT_EQ(regions.FindStartingAt(999, 1), std::nullopt);
  EXPECT_EQ(regions.FindStartingAt(7000, 1), std::nullopt);
}

TEST(RemoteRegionsTest, RangeStraddlingAdjacentRegionsIsInNeither) {
  const RemoteRegions regions = RegionsOf({{1000, 1000}, {2000, 1000}});
  EXPECT_EQ(regions.Find(1500, 1000), std::nullopt);
  EXPECT_EQ(regions.Find(1999, 2), std::nullopt);
  EXPECT_EQ(regions.Find(2000, 1000), 1);
}

TEST(RemoteRegionsTest, RejectsZeroLengthRegion) {
  const absl::Status status =
      RemoteRegions::FromDescriptor(DescriptorOf({{1000, 10}, {4000, 0}})).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("region 1"), absl::string_view::npos) << status;
}

TEST(RemoteRegionsTest, RejectsRegionEndingPast2To64) {
  EXPECT_TRUE(RemoteRegions::FromDescriptor(DescriptorOf({{UINT64_MAX - 9, 10}})).ok());
  EXPECT_EQ(RemoteRegions::FromDescriptor(DescriptorOf({{UINT64_MAX - 9, 11}})).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RemoteRegionsTest, RejectsOverlappingRegions) {
  EXPECT_EQ(
      RemoteRegions::FromDescriptor(DescriptorOf({{2000, 1000}, {1000, 1001}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoteRegions::FromDescriptor(DescriptorOf({{1000, 10}, {1000, 10}})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RemoteRegions::FromDescriptor(DescriptorOf({{2000, 1000}, {1000, 1000}})).ok());
}

TEST(RemoteRegionsTest, EmptyDescriptorHoldsNothing) {
  const RemoteRegions regions = RegionsOf({});
  EXPECT_EQ(regions.size(), 0);
  EXPECT_EQ(regions.Find(0, 1), std::nullopt);
}

TEST(CheckLaneTest, AcceptsOnlyLanesOfTheTransport) {
  EXPECT_TRUE(CheckLane(0, 2).ok());
  EXPECT_TRUE(CheckLane(1, 2).ok());
  EXPECT_EQ(CheckLane(2, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckLane(-1, 2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckLocalRegionTest, RejectsNullEmptyWrappingAndUnsupportedCuda) {
  char byte = 0;
  EXPECT_TRUE(CheckLocalRegion({&byte, 1, false}, false).ok());
  EXPECT_EQ(CheckLocalRegion({nullptr, 1, false}, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckLocalRegion({&byte, 0, false}, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckLocalRegion({&byte, UINT64_MAX, false}, false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckLocalRegion({&byte, 1, true}, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckLocalRegion({&byte, 1, true}, true).ok());
}

class CheckWritesTest : public testing::Test {
 protected:
  const RemoteRegions remote_ = RegionsOf({{0x10000, 0x1000}, {0x20000, 0x1000}});
  static constexpr uint64_t kSourceLength = 0x800;
  static constexpr uint64_t kMaxWrite = 0x400;
  // Transports of kMaxWrite bytes a write: one row a write; any strided write; rows gathered
  // into contiguous bytes at the peer, up to `rows` a write.
  static Capabilities OneRowAWrite() { return {.max_write_bytes = kMaxWrite}; }
  static Capabilities AnyRows() { return {.max_write_bytes = kMaxWrite, .strided_writes = true}; }
  static Capabilities Gathering(uint32_t rows) {
    return {.max_write_bytes = kMaxWrite, .max_gather_rows = rows};
  }
  // 4 rows of 0x80 bytes from source offset 0, every 0x100, to 0x10000 every `remote_stride`.
  static Write FourRows(uint64_t remote_stride) {
    return {.local_offset = 0,
            .remote_address = 0x10000,
            .length = 0x80,
            .rows = 4,
            .local_stride = 0x100,
            .remote_stride = remote_stride};
  }
};

TEST_F(CheckWritesTest, AcceptsABatchSpanningSeveralRegions) {
  const std::vector<Write> writes = {{0, 0x10000, 0x400}, {0x400, 0x20c00, 0x400}};
  EXPECT_TRUE(CheckWrites(writes, kSourceLength, remote_, OneRowAWrite()).ok());
}

TEST_F(CheckWritesTest, GivesEachWritesRegionWhenAsked) {
  const std::vector<Write> writes = {
      {0, 0x20000, 0x400}, {0x400, 0x10c00, 0x400}, {0, 0x20400, 0x10}};
  std::vector<int> region_of = {7, 7, 7, 7};  // whatever was there is replaced
  ASSERT_TRUE(CheckWrites(writes, kSourceLength, remote_, OneRowAWrite(), &region_of).ok());
  EXPECT_EQ(region_of,
            (std::vector<int>{*remote_.Find(0x20000, 0x400), *remote_.Find(0x10c00, 0x400),
                              *remote_.Find(0x20400, 0x10)}));
  EXPECT_NE(region_of[0], region_of[1]);
}

TEST_F(CheckWritesTest, RejectsEmptyBatch) {
  EXPECT_EQ(CheckWrites({}, kSourceLength, remote_, OneRowAWrite()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckWritesTest, RejectsZeroLengthWriteByIndex) {
  const std::vector<Write> writes = {{0, 0x10000, 8}, {8, 0x10008, 0}};
  const absl::Status status = CheckWrites(writes, kSourceLength, remote_, OneRowAWrite());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("write 1 of 2"), absl::string_view::npos) << status;
}

TEST_F(CheckWritesTest, RejectsWriteLongerThanMaxWriteBytes) {
  const std::vector<Write> writes = {{0, 0x10000, kMaxWrite + 1}};
  EXPECT_EQ(CheckWrites(writes, 0x1000, remote_, OneRowAWrite()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckWritesTest, RejectsSourceRangePastTheSourceRegion) {
  EXPECT_EQ(CheckWrites({{{0x700, 0x10000, 0x101}}}, kSourceLength, remote_, OneRowAWrite()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      CheckWrites({{{0x700, 0x10000, 0x100}}}, kSourceLength, remote_, OneRowAWrite()).ok());
  EXPECT_EQ(CheckWrites({{{UINT64_MAX - 1, 0x10000, 0x10}}}, kSourceLength, remote_, OneRowAWrite())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckWritesTest, RejectsDestinationOutsideEveryRegion) {
  for (uint64_t address : {uint64_t{0x0ffff}, uint64_t{0x10f01}, uint64_t{0x18000},
                           uint64_t{0x20f01}, UINT64_MAX - 0x10}) {
    const std::vector<Write> writes = {{0, 0x10000, 0x100}, {0, address, 0x100}};
    const absl::Status status = CheckWrites(writes, kSourceLength, remote_, OneRowAWrite());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_NE(status.message().find("write 1 of 2: destination"), absl::string_view::npos)
        << status;
  }
}

TEST_F(CheckWritesTest, RejectsDestinationStraddlingTwoRegions) {
  const RemoteRegions adjacent = RegionsOf({{0x1000, 0x1000}, {0x2000, 0x1000}});
  EXPECT_EQ(CheckWrites({{{0, 0x1f00, 0x200}}}, kSourceLength, adjacent, OneRowAWrite()).code(),
            absl::StatusCode::kInvalidArgument);
}

// A strided write (rows > 1) is checked by the span of its rows on each side, and by its payload
// against max_write_bytes; a backend that takes one row a write refuses it.
TEST_F(CheckWritesTest, ChecksAStridedWriteByItsRows) {
  const Write strided = FourRows(0x200);  // span 0x680 at the peer
  std::vector<int> region_of;
  EXPECT_TRUE(CheckWrites({&strided, 1}, kSourceLength, remote_, AnyRows(), &region_of).ok());
  EXPECT_EQ(region_of, std::vector<int>{0});
  const absl::Status one_row = CheckWrites({&strided, 1}, kSourceLength, remote_, OneRowAWrite());
  EXPECT_NE(one_row.message().find("4 rows; this transport takes one row a write"),
            absl::string_view::npos)
      << one_row;
  Write last_row_out = strided;
  last_row_out.remote_address = 0x10a00;  // the first row inside, the last past the region
  EXPECT_NE(CheckWrites({&last_row_out, 1}, kSourceLength, remote_, AnyRows())
                .message()
                .find("destination [0x10a00, +1664)"),
            absl::string_view::npos);
  Write source_out = strided;
  source_out.local_offset = 0x500;  // last row at 0x800: past the source's 0x800 bytes
  EXPECT_NE(CheckWrites({&source_out, 1}, kSourceLength, remote_, AnyRows())
                .message()
                .find("source [1280, +896)"),
            absl::string_view::npos);
  Write overlapping = strided;
  overlapping.remote_stride = 0x40;
  EXPECT_NE(CheckWrites({&overlapping, 1}, kSourceLength, remote_, AnyRows())
                .message()
                .find("rows must not overlap"),
            absl::string_view::npos);
  Write too_much = strided;
  too_much.rows = 9;  // 0x480 bytes of payload > kMaxWrite
  EXPECT_NE(
      CheckWrites({&too_much, 1}, 0x10000, remote_, AnyRows()).message().find("1152 bytes exceed"),
      absl::string_view::npos);
  Write wrapping = strided;
  wrapping.remote_stride = UINT64_MAX / 2;
  EXPECT_NE(CheckWrites({&wrapping, 1}, kSourceLength, remote_, AnyRows()).message().find("2^64"),
            absl::string_view::npos);
  Write no_rows = strided;
  no_rows.rows = 0;
  EXPECT_NE(CheckWrites({&no_rows, 1}, kSourceLength, remote_, AnyRows()).message().find("0 rows"),
            absl::string_view::npos);
}

// A transport that gathers (verbs' scatter-gather lists) takes rows landing as contiguous bytes
// at the peer, up to its limit a write, and refuses rows landing apart with a line that says so.
TEST_F(CheckWritesTest, AGatheringTransportTakesRowsThatLandContiguousUpToItsLimit) {
  const Write gather = FourRows(0x80);  // back to back at the peer
  EXPECT_TRUE(CheckWrites({&gather, 1}, kSourceLength, remote_, Gathering(4)).ok());
  const absl::Status too_many = CheckWrites({&gather, 1}, kSourceLength, remote_, Gathering(3));
  EXPECT_NE(too_many.message().find("at most 3 a write"), absl::string_view::npos) << too_many;
  Write apart = gather;
  apart.remote_stride = 0x100;
  const absl::Status scattered = CheckWrites({&apart, 1}, kSourceLength, remote_, Gathering(16));
  EXPECT_NE(scattered.message().find("write 0 of 1: 4 rows of 128 bytes landing 256 apart; this "
                                     "transport takes rows only gathered into contiguous bytes"),
            absl::string_view::npos)
      << scattered;
  EXPECT_EQ(MaxRowsPerWrite(Gathering(16), 0x80, 0x80), 16u);
  EXPECT_EQ(MaxRowsPerWrite(Gathering(16), 0x80, 0x100), 1u);
  EXPECT_EQ(MaxRowsPerWrite(AnyRows(), 0x80, 0x100), UINT64_MAX);
  EXPECT_EQ(MaxRowsPerWrite(OneRowAWrite(), 0x80, 0x80), 1u);
}

}  // namespace
}  // namespace kvrail::transport
