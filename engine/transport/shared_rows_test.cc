#include "engine/transport/shared_rows.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvrail::transport {
namespace {

constexpr uint64_t kKiB = 1024;

// An arena that is never read: the runs compare addresses only.
std::byte kSource[64 * 1024];
std::byte kDestination[64 * 1024];

StoredRows Slice(uint64_t offset, uint64_t length, uint64_t rows, uint64_t stride, uint32_t batch) {
  return {
      kSource + offset, kDestination + batch * 16 * kKiB, length, rows, stride, length, batch, 0};
}

// 1:2: each of two decode ranks' writes reads its KiB of every 2 KiB source row; posted in either
// order, they make one run, in source order.
TEST(SharedRowsTest, TwoPeersHalvesOfTheSameRowsAreOneRun) {
  std::vector<StoredRows> writes = {Slice(kKiB, kKiB, 8, 2 * kKiB, 1),
                                    Slice(0, kKiB, 8, 2 * kKiB, 0)};
  std::vector<SharedRowRun> runs;
  SharedRowRuns(writes, &runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].begin, 0u);
  EXPECT_EQ(runs[0].end, 2u);
  EXPECT_EQ(writes[0].batch, 0u);
  EXPECT_EQ(writes[1].batch, 1u);
}

// 2:4: a prefill rank's 2 KiB rows hold 4 heads' slices of 512 B, two per decode rank; a rank's
// batch carries its slices as separate writes (or one, where they are adjacent), and the stretch
// of rows after the first is a run of its own.
TEST(SharedRowsTest, EverySliceOfARowAndEachStretchOfRows) {
  std::vector<StoredRows> writes;
  for (uint32_t s = 0; s < 4; ++s) writes.push_back(Slice(s * 512, 512, 4, 2 * kKiB, s));
  for (uint32_t s = 0; s < 4; ++s) writes.push_back(Slice(8 * kKiB + s * 512, 512, 4, 2 * kKiB, s));
  std::vector<SharedRowRun> runs;
  SharedRowRuns(writes, &runs);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].end - runs[0].begin, 4u);
  EXPECT_EQ(runs[1].end - runs[1].begin, 4u);
}

// What is not a run: one write alone, rows of another count or stride, slices with a gap or an
// overlap, a slice past the first one's row, single rows, and rows whole (no stride to share).
TEST(SharedRowsTest, OnlySlicesBackToBackInsideOneRowOfTheSameRows) {
  const auto no_run = [](std::vector<StoredRows> writes) {
    std::vector<SharedRowRun> runs = {{0, 1}};  // cleared first
    SharedRowRuns(writes, &runs);
    return runs.empty();
  };
  EXPECT_TRUE(no_run({Slice(0, kKiB, 8, 2 * kKiB, 0)}));
  EXPECT_TRUE(no_run({Slice(0, kKiB, 8, 2 * kKiB, 0), Slice(kKiB, kKiB, 4, 2 * kKiB, 1)}));
  EXPECT_TRUE(no_run({Slice(0, kKiB, 8, 2 * kKiB, 0), Slice(kKiB, kKiB, 8, 3 * kKiB, 1)}));
  EXPECT_TRUE(no_run({Slice(0, 512, 8, 2 * kKiB, 0), Slice(kKiB, 512, 8, 2 * kKiB, 1)}));
  EXPECT_TRUE(no_run({Slice(0, kKiB, 8, 2 * kKiB, 0), Slice(512, kKiB, 8, 2 * kKiB, 1)}));
  EXPECT_TRUE(no_run({Slice(0, kKiB, 8, kKiB + 512, 0), Slice(kKiB, kKiB, 8, kKiB + 512, 1)}));
  EXPECT_TRUE(no_run({Slice(0, kKiB, 1, 2 * kKiB, 0), Slice(kKiB, kKiB, 1, 2 * kKiB, 1)}));
  EXPECT_TRUE(no_run({Slice(0, kKiB, 8, kKiB, 0), Slice(8 * kKiB, kKiB, 8, kKiB, 1)}));
}

// Three slices of a 3 KiB row (a TP of 1 into 3) make one run; a fourth, of the next row, does
// not join it.
TEST(SharedRowsTest, ARunEndsAtTheFirstSlicesRow) {
  std::vector<StoredRows> writes;
  for (uint32_t s = 0; s < 4; ++s) writes.push_back(Slice(s * kKiB, kKiB, 4, 3 * kKiB, s));
  std::vector<SharedRowRun> runs;
  SharedRowRuns(writes, &runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].begin, 0u);
  EXPECT_EQ(runs[0].end, 3u);
}

}  // namespace
}  // namespace kvrail::transport
