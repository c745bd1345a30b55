// CudaArenaStaging (cuda_arena_staging.h): the "no GPU" refusal runs everywhere; the round trip
// through the mirror runs where a GPU is lent and skips, saying why, elsewhere.
#include "engine/memory/cuda_arena_staging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/memory/cuda_arena.h"
#include "engine/memory/cuda_test_support.h"
#include "engine/memory/pattern.h"

namespace kvrail {
namespace {

using ::testing::HasSubstr;

TEST(CudaArenaStagingTest, WithoutGpuCreateRefusesInOneLine) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a GPU is present; nothing to refuse";
  std::vector<uint8_t> arena(64), mirror(64);
  const absl::Status status =
      CudaArenaStaging::Create(arena.data(), mirror.data(), 64, StagingOptions{}).status();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status;
}

TEST(CudaArenaStagingTest, NothingToStageIsRefusedBeforeAnyCudaCall) {
  std::vector<uint8_t> mirror(64);
  const absl::Status status =
      CudaArenaStaging::Create(nullptr, mirror.data(), 64, StagingOptions{}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("the arena, the mirror and their size"));
}

TEST(CudaArenaStagingTest, RangesGoToTheMirrorAndBackByteExact) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 24 << 20;  // several chunks of 4 MiB, with a partial one
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(7).ok());
  std::vector<uint8_t> mirror(kBytes, 0);
  StagingOptions options;
  options.chunk_bytes = 1 << 20;
  options.depth = 3;
  auto staging = CudaArenaStaging::Create(arena->data(), mirror.data(), kBytes, options);
  ASSERT_TRUE(staging.ok()) << staging.status();
  const std::vector<ByteRange> ranges = {{4096, (5 << 20) + 17}, {20 << 20, 3 << 20}};
  ASSERT_TRUE((*staging)->ToMirror(ranges).ok());
  std::vector<uint8_t> expected(kBytes);
  FillPattern(absl::MakeSpan(expected), 7);
  for (const ByteRange& r : ranges) {
    for (uint64_t i = r.offset; i < r.offset + r.length; ++i) {
      ASSERT_EQ(mirror[i], expected[i]) << "byte " << i;
    }
  }
  EXPECT_EQ(mirror[0], 0);
  // Back: scribble the mirror's ranges and scatter them onto the GPU.
  for (const ByteRange& r : ranges) {
    for (uint64_t i = r.offset; i < r.offset + r.length; ++i) mirror[i] = 0x5A;
  }
  ASSERT_TRUE((*staging)->FromMirror(ranges).ok());
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(back)).ok());
  for (uint64_t i = 0; i < kBytes; ++i) {
    const bool inside =
        (i >= 4096 && i < 4096 + (5 << 20) + 17) || (i >= (20 << 20) && i < (23 << 20));
    ASSERT_EQ(back[i], inside ? 0x5A : expected[i]) << "byte " << i;
  }
}

// Head-sliced pages' rows (issue 31): a range of rows crosses the bus as one 2-D copy a chunk
// each way, rows short enough to pack and rows longer than a chunk alike; the bytes between
// the rows (another rank's) are left as they were, on the GPU and in the mirror.
TEST(CudaArenaStagingTest, RowsGoToTheMirrorAndBackByteExactLeavingTheGapsAlone) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 8 << 20;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(11).ok());
  std::vector<uint8_t> mirror(kBytes, 0);
  StagingOptions options;
  options.chunk_bytes = 64 << 10;  // 21 rows of 3000 bytes a chunk; a 100000-byte row is longer
  options.depth = 2;
  auto staging = CudaArenaStaging::Create(arena->data(), mirror.data(), kBytes, options);
  ASSERT_TRUE(staging.ok()) << staging.status();
  // 1000 rows of 3000 bytes every 4096 (several chunks, a partial last one), and 3 rows of
  // 100000 bytes every 200000.
  const std::vector<ByteRange> ranges = {{1024, 3000, 1000, 4096}, {5 << 20, 100000, 3, 200000}};
  const auto inside = [&](uint64_t i) {
    for (const ByteRange& r : ranges) {
      if (i < r.offset || i >= r.offset + RangeSpan(r)) continue;
      if ((i - r.offset) % r.stride < r.length) return true;
    }
    return false;
  };
  ASSERT_TRUE((*staging)->ToMirror(ranges).ok());
  std::vector<uint8_t> expected(kBytes);
  FillPattern(absl::MakeSpan(expected), 11);
  for (uint64_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(mirror[i], inside(i) ? expected[i] : 0) << "byte " << i;
  }
  for (uint64_t i = 0; i < kBytes; ++i) {
    if (inside(i)) mirror[i] = 0xA5;
  }
  ASSERT_TRUE((*staging)->FromMirror(ranges).ok());
  std::vector<uint8_t> back(kBytes);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(back)).ok());
  for (uint64_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(back[i], inside(i) ? 0xA5 : expected[i]) << "byte " << i;
  }
}

}  // namespace
}  // namespace kvrail
