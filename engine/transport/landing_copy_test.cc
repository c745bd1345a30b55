#include "engine/transport/landing_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace kvrail::transport {
namespace {

class LandingCopyTest : public ::testing::TestWithParam<LandingStores> {};

// Every length from 0 to a few lines past the streaming threshold, at every alignment of the
// source and destination within a line: exactly the bytes asked for are copied, and the guard
// bytes on both sides of the destination keep theirs.
TEST_P(LandingCopyTest, CopiesExactlyTheBytesAtEveryLengthAndAlignment) {
  constexpr size_t kMax = kLandingStreamMin + 5 * 64 + 7;
  std::vector<std::byte> src(kMax + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xFF);
  alignas(64) static std::byte dst[kMax + 256];
  for (size_t src_shift : {0, 1, 16, 33, 63}) {
    for (size_t dst_shift = 0; dst_shift < 64; dst_shift += 7) {
      for (size_t n = 0; n <= kMax; n += (n < 300 ? 1 : 13)) {
        std::memset(dst, 0xA5, sizeof(dst));
        LandingCopy(dst + 64 + dst_shift, src.data() + src_shift, n, GetParam());
        LandingFence();
        for (size_t i = 0; i < sizeof(dst); ++i) {
          const bool inside = i >= 64 + dst_shift && i < 64 + dst_shift + n;
          const std::byte want =
              inside ? src[src_shift + i - 64 - dst_shift] : static_cast<std::byte>(0xA5);
          ASSERT_EQ(dst[i], want) << "byte " << i << " of a copy of " << n << " bytes, source +"
                                  << src_shift << ", destination +" << dst_shift;
        }
      }
    }
  }
}

// A row copy as a head-sliced room makes it: 1 KiB rows into every other KiB of a page.
TEST_P(LandingCopyTest, StridedRowsLandInPlaceAndLeaveTheGapsAlone) {
  constexpr size_t kRow = 1024;
  constexpr size_t kRows = 64;
  std::vector<std::byte> src(kRow * kRows);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i % 251);
  std::vector<std::byte> dst(2 * kRow * kRows, std::byte{0x11});
  for (size_t r = 0; r < kRows; ++r)
    LandingCopy(&dst[2 * r * kRow], &src[r * kRow], kRow, GetParam());
  LandingFence();
  for (size_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(std::memcmp(&dst[2 * r * kRow], &src[r * kRow], kRow), 0) << "row " << r;
    for (size_t i = 0; i < kRow; ++i) {
      ASSERT_EQ(dst[(2 * r + 1) * kRow + i], std::byte{0x11}) << "gap after row " << r;
    }
  }
}

// LandingCopyRows lands what a LandingCopy per row would, in one call, for rows shorter and
// longer than the streaming threshold, from packed and from strided sources, rows that are one
// range at both ends (copied as one), at odd alignments, and touches nothing between the rows or
// past the last; zero rows write nothing.
TEST_P(LandingCopyTest, RowsLandAsARowAtATimeWould) {
  struct Case {
    size_t length, rows, src_stride, dst_stride, dst_shift;
  };
  for (const Case& c :
       {Case{1024, 64, 1024, 2048, 0}, Case{256, 33, 256, 1024, 5},
        Case{kLandingStreamMin - 1, 9, 300, 700, 63},
        Case{kLandingStreamMin + 65, 7, 1000, kLandingStreamMin + 65, 17},
        Case{512, 16, 2048, 512, 1}, Case{64, 0, 64, 128, 0}, Case{1024, 16, 1024, 1024, 3},
        Case{kLandingStreamMin + 9, 5, kLandingStreamMin + 9, kLandingStreamMin + 9, 0}}) {
    std::vector<std::byte> src(c.src_stride * (c.rows + 1) + c.length);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 37 + 3) & 0xFF);
    const size_t span = c.dst_shift + c.dst_stride * (c.rows + 1) + 128;
    std::vector<std::byte> want(span, std::byte{0x5A});
    std::vector<std::byte> got(span, std::byte{0x5A});
    for (size_t r = 0; r < c.rows; ++r) {
      std::memcpy(&want[c.dst_shift + r * c.dst_stride], &src[r * c.src_stride], c.length);
    }
    LandingCopyRows(got.data() + c.dst_shift, c.dst_stride, src.data(), c.src_stride, c.length,
                    c.rows, GetParam());
    LandingFence();
    for (size_t i = 0; i < span; ++i) {
      ASSERT_EQ(got[i], want[i]) << "byte " << i << " of " << c.rows << " rows of " << c.length
                                 << " bytes, source stride " << c.src_stride
                                 << ", destination stride " << c.dst_stride;
    }
  }
}

// A shared pass lands each slice's rows as LandingCopyRows of that slice alone would: 1:2's two
// halves, 2:4's four quarters (one of them unaligned and shorter than a streamed copy), and more
// slices than one group of the pass holds (17 of a 17-slice row).
TEST_P(LandingCopyTest, SharedRowsLandAsEachSliceAloneWould) {
  struct Case {
    size_t slices, length, rows;
  };
  for (const Case& c : {Case{2, 1024, 64}, Case{4, 512, 33}, Case{4, kLandingStreamMin - 3, 9},
                        Case{17, 128, 5}, Case{2, 1024, 0}}) {
    const size_t src_stride = c.slices * c.length;
    std::vector<std::byte> src(src_stride * c.rows + 64);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 29 + 7) & 0xFF);
    // Slice k lands in a part of its own, its rows back to back, 3 bytes past the part's start.
    const size_t part = c.length * c.rows + 64;
    std::vector<std::byte> want(c.slices * part, std::byte{0x5A});
    std::vector<std::byte> got(c.slices * part, std::byte{0x5A});
    std::vector<LandingSlice> slices;
    for (size_t k = 0; k < c.slices; ++k) {
      for (size_t r = 0; r < c.rows; ++r) {
        std::memcpy(&want[k * part + 3 + r * c.length], &src[r * src_stride + k * c.length],
                    c.length);
      }
      slices.push_back({got.data() + k * part + 3, c.length, src.data() + k * c.length, c.length});
    }
    LandingCopySharedRows(slices.data(), slices.size(), src_stride, c.rows, GetParam());
    LandingFence();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "byte " << i << " of " << c.slices << " slices of " << c.rows
                                 << " rows of " << c.length << " bytes";
    }
  }
}

TEST(LandingStoresTest, NamesGoBothWays) {
  for (LandingStores stores : kAllLandingStores) {
    EXPECT_EQ(LandingStoresNamed(LandingStoresName(stores)), stores);
  }
  EXPECT_EQ(LandingStoresNamed("fast"), std::nullopt);
  EXPECT_EQ(LandingStoresNamed("auto"), LandingStores::kAuto);
}

// auto streams rows that are not one range (several rows, a stride at either end longer than a
// row: rows that land apart, rows read apart) and stores everything else plainly; plain and
// streaming are what they say whatever the shape.
TEST(LandingStoresTest, AutoStreamsRowsThatAreNotOneRangeAndNothingElse) {
  constexpr LandingStores kAuto = LandingStores::kAuto;
  EXPECT_EQ(LandingStoresFor(kAuto, 1024, 1024, 2048, 64), LandingStores::kStreaming);  // 2:1
  EXPECT_EQ(LandingStoresFor(kAuto, 512, 512, 1024, 2), LandingStores::kStreaming);     // 4:2
  EXPECT_EQ(LandingStoresFor(kAuto, 256, 256, 1024, 7), LandingStores::kStreaming);     // 8:2
  EXPECT_EQ(LandingStoresFor(kAuto, 1024, 2048, 1024, 64), LandingStores::kStreaming);  // 1:2
  EXPECT_EQ(LandingStoresFor(kAuto, 512, 1024, 1024, 8), LandingStores::kStreaming);    // both
  EXPECT_EQ(LandingStoresFor(kAuto, 1024, 1024, 1024, 64), LandingStores::kPlain);      // one range
  EXPECT_EQ(LandingStoresFor(kAuto, 1024, 2048, 2048, 1), LandingStores::kPlain);       // one row
  EXPECT_EQ(LandingStoresFor(kAuto, 4 << 20, 4 << 20, 4 << 20, 1), LandingStores::kPlain);
  EXPECT_EQ(LandingStoresFor(kAuto, 1024, 2048, 2048, 0), LandingStores::kPlain);
  for (size_t rows : {size_t{1}, size_t{64}}) {
    EXPECT_EQ(LandingStoresFor(LandingStores::kPlain, 1024, 2048, 2048, rows),
              LandingStores::kPlain);
    EXPECT_EQ(LandingStoresFor(LandingStores::kStreaming, 1024, 1024, 1024, rows),
              LandingStores::kStreaming);
  }
}

// auto: LandingCopy and rows that are one range plain, other rows streaming (the cases above have
// both).
INSTANTIATE_TEST_SUITE_P(Stores, LandingCopyTest, ::testing::ValuesIn(kAllLandingStores),
                         [](const ::testing::TestParamInfo<LandingStores>& info) {
                           return std::string(LandingStoresName(info.param));
                         });

}  // namespace
}  // namespace kvrail::transport
