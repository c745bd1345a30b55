#include "engine/memory/pattern.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace kvrail {
namespace {

TEST(PatternTest, FilledBufferMatches) {
  std::vector<uint8_t> buffer(4096);
  FillPattern(absl::MakeSpan(buffer), 42);
  EXPECT_EQ(FirstPatternMismatch(buffer, 42), std::nullopt);
}

TEST(PatternTest, MismatchReportsFirstDifferingIndex) {
  std::vector<uint8_t> buffer(4096);
  FillPattern(absl::MakeSpan(buffer), 42);
  buffer[1000] ^= 1;
  buffer[2000] ^= 1;
  EXPECT_EQ(FirstPatternMismatch(buffer, 42), 1000u);
}

TEST(PatternTest, SliceFilledAtItsOffsetMatchesTheWhole) {
  std::vector<uint8_t> whole(1024);
  FillPattern(absl::MakeSpan(whole), 7);
  std::vector<uint8_t> slice(100);
  FillPattern(absl::MakeSpan(slice), 7, 300);
  EXPECT_EQ(FirstPatternMismatch(absl::MakeConstSpan(whole).subspan(300, 100), 7, 300),
            std::nullopt);
  EXPECT_TRUE(std::equal(slice.begin(), slice.end(), whole.begin() + 300));
}

TEST(PatternTest, BytesAtTheWrongOffsetOrFromAnotherSeedDoNotMatch) {
  std::vector<uint8_t> buffer(256);
  FillPattern(absl::MakeSpan(buffer), 7, 8);
  EXPECT_NE(FirstPatternMismatch(buffer, 7, 0), std::nullopt);
  EXPECT_NE(FirstPatternMismatch(buffer, 8, 8), std::nullopt);
}

// The loops work 8 bytes at a time with a byte-wise tail: every size and offset around a word,
// and a flipped byte at every index, give what PatternByte gives one byte at a time.
TEST(PatternTest, EveryByteIsPatternByteAndEveryFlippedByteIsFoundAtItsIndex) {
  for (size_t size = 0; size <= 40; ++size) {
    for (uint64_t offset = 0; offset < 10; ++offset) {
      std::vector<uint8_t> buffer(size);
      FillPattern(absl::MakeSpan(buffer), 5, offset);
      for (size_t i = 0; i < size; ++i) {
        ASSERT_EQ(buffer[i], PatternByte(5, offset + i)) << "size " << size << " offset " << offset;
      }
      ASSERT_EQ(FirstPatternMismatch(buffer, 5, offset), std::nullopt);
      for (size_t i = 0; i < size; ++i) {
        buffer[i] ^= 0x80;
        if (i + 9 < size) buffer[i + 9] ^= 1;  // a later difference too: the first is reported
        ASSERT_EQ(FirstPatternMismatch(buffer, 5, offset), i) << "size " << size;
        buffer[i] ^= 0x80;
        if (i + 9 < size) buffer[i + 9] ^= 1;
      }
    }
  }
}

TEST(PatternTest, ZeroFilledMemoryDoesNotMatch) {
  std::vector<uint8_t> zeros(64, 0);
  EXPECT_NE(FirstPatternMismatch(zeros, 1), std::nullopt);
}

}  // namespace
}  // namespace kvrail
