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

TEST(PatternTest, ZeroFilledMemoryDoesNotMatch) {
  std::vector<uint8_t> zeros(64, 0);
  EXPECT_NE(FirstPatternMismatch(zeros, 1), std::nullopt);
}

}  // namespace
}  // namespace kvrail
