#include "tests/support/byte_count.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kvrail::testing {
namespace {

TEST(ByteCountTest, CountsEveryDifferingByteWhereverItIs) {
  // Sizes around the 64 KiB chunk and the 8-byte word, differences at the edges of both.
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{9}, size_t{65535}, size_t{65536},
                   size_t{65537}, size_t{200003}}) {
    std::vector<uint8_t> a(n, 0x5A), b(n, 0x5A);
    EXPECT_EQ(CountBytesNot(a.data(), n, 0x5A), 0u);
    EXPECT_EQ(CountBytesDiffering(a.data(), b.data(), n), 0u);
    uint64_t changed = 0;
    for (size_t i : {size_t{0}, n / 2, n - 1, size_t{7}, size_t{8}, size_t{65535}, size_t{65536}}) {
      if (i >= n || a[i] != 0x5A) continue;
      a[i] = static_cast<uint8_t>(i % 2 == 0 ? 0x00 : 0xA5);  // bits below and above 0x5A's
      ++changed;
    }
    EXPECT_EQ(CountBytesNot(a.data(), n, 0x5A), changed) << n;
    EXPECT_EQ(CountBytesDiffering(a.data(), b.data(), n), changed) << n;
    EXPECT_EQ(CountBytesNot(a.data(), n, 0x11), n) << n;
  }
}

}  // namespace
}  // namespace kvrail::testing
