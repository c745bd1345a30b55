#include "engine/memory/prefault.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/memory/resident_pages.h"

namespace kvrail {
namespace {

using ::kvrail::testing::ResidentPages;

class PrefaultTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kLength = 5 * Prefaulter::kChunkBytes + 12345;
  void SetUp() override {
    void* base = mmap(nullptr, kLength, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(base, MAP_FAILED);
    base_ = static_cast<std::byte*>(base);
  }
  void TearDown() override { munmap(base_, kLength); }
  std::byte* base_ = nullptr;
};

// A store's chunks are populated once each, with their bytes kept; others stay untouched.
TEST_F(PrefaultTest, PopulatesEachChunkOfAStoreOnceAndKeepsTheBytes) {
  base_[Prefaulter::kChunkBytes + 7] = std::byte{0x5a};
  Prefaulter prefault(base_, kLength);
  ASSERT_TRUE(prefault.enabled());
  // A store straddling chunks 1 and 2.
  prefault.Before(base_ + 2 * Prefaulter::kChunkBytes - 100, 200);
  EXPECT_EQ(prefault.chunks_populated(), 2u);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(ResidentPages(base_, kLength), 2 * Prefaulter::kChunkBytes / page);
  EXPECT_EQ(base_[Prefaulter::kChunkBytes + 7], std::byte{0x5a});
  for (uint64_t i = Prefaulter::kChunkBytes; i < 3 * Prefaulter::kChunkBytes; i += 4093) {
    if (i != Prefaulter::kChunkBytes + 7) {
      ASSERT_EQ(base_[i], std::byte{0}) << i;
    }
  }
  // The same chunks again cost nothing more.
  prefault.Before(base_ + Prefaulter::kChunkBytes, Prefaulter::kChunkBytes);
  EXPECT_EQ(prefault.chunks_populated(), 2u);
}

// The last chunk is short: populated up to the mapping's end, never past it; ranges outside
// the mapping and empty ones are ignored.
TEST_F(PrefaultTest, StaysInsideTheMapping) {
  Prefaulter prefault(base_, kLength);
  prefault.Before(base_ + kLength - 10, 1000);  // runs past the end: clipped
  EXPECT_EQ(prefault.chunks_populated(), 1u);
  EXPECT_TRUE(prefault.enabled());
  prefault.Before(base_ + kLength, 10);
  prefault.Before(base_ - 4096, 10);
  prefault.Before(base_, 0);
  EXPECT_EQ(prefault.chunks_populated(), 1u);
  Prefaulter none;
  none.Before(base_, 10);
  EXPECT_EQ(none.chunks_populated(), 0u);
}

// Populating while another thread writes the same pages loses none of its bytes (the populate
// never writes data).
TEST_F(PrefaultTest, AConcurrentWriterKeepsItsBytes) {
  Prefaulter prefault(base_, kLength);
  std::thread writer([this] {
    for (uint64_t i = 0; i < kLength; i += 64) base_[i] = std::byte{static_cast<uint8_t>(i >> 6)};
  });
  for (uint64_t at = 0; at < kLength; at += 4096) prefault.Before(base_ + at, 4096);
  writer.join();
  EXPECT_EQ(prefault.chunks_populated(), 6u);
  for (uint64_t i = 0; i < kLength; i += 64) {
    ASSERT_EQ(base_[i], std::byte{static_cast<uint8_t>(i >> 6)}) << i;
  }
}

}  // namespace
}  // namespace kvrail
