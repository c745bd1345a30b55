#include "engine/transfer/copy_list_pool.h"

#include <gtest/gtest.h>

#include <thread>
#include <utility>
#include <vector>

namespace kvrail::transfer {
namespace {

CopyList WithCapacity(size_t copies) {
  CopyList list;
  list.Extend(copies);
  return list;
}

// A list given back comes out again, empty and with its storage: the next room's copies land
// in memory the last room's already touched.
TEST(CopyListPoolTest, AListGivenBackIsTakenAgainEmptyWithItsStorage) {
  CopyListPool pool;
  EXPECT_EQ(pool.Take().capacity(), 0u);  // nothing kept yet: a fresh list
  CopyList list = WithCapacity(1000);
  const Copy* storage = list.begin();
  pool.Give(std::move(list));
  EXPECT_EQ(pool.idle_lists(), 1u);
  EXPECT_EQ(pool.idle_bytes(), 1000 * sizeof(Copy));
  CopyList again = pool.Take();
  EXPECT_EQ(again.size(), 0u);
  EXPECT_EQ(again.capacity(), 1000u);
  EXPECT_EQ(again.begin(), storage);
  EXPECT_EQ(pool.idle_lists(), 0u);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

// Take hands out the largest list kept; the pool never holds more than its bound, keeping the
// largest lists and freeing the rest (an empty list is not kept at all).
TEST(CopyListPoolTest, KeepsTheLargestListsWithinItsBound) {
  CopyListPool pool(/*max_bytes=*/3000 * sizeof(Copy));
  pool.Give(CopyList());
  EXPECT_EQ(pool.idle_lists(), 0u);
  pool.Give(WithCapacity(1000));
  pool.Give(WithCapacity(500));
  pool.Give(WithCapacity(1500));
  EXPECT_EQ(pool.idle_bytes(), 3000 * sizeof(Copy));
  pool.Give(WithCapacity(1200));  // room made by freeing the 500 and the 1000
  EXPECT_EQ(pool.idle_lists(), 2u);
  EXPECT_EQ(pool.idle_bytes(), 2700 * sizeof(Copy));
  pool.Give(WithCapacity(400));  // smaller than every list kept, and no room: freed
  EXPECT_EQ(pool.idle_lists(), 2u);
  EXPECT_EQ(pool.Take().capacity(), 1500u);
  pool.Give(WithCapacity(4000));  // larger than the bound: freed, and nothing else dropped
  EXPECT_EQ(pool.idle_lists(), 1u);
  EXPECT_EQ(pool.idle_bytes(), 1200 * sizeof(Copy));
}

// Threads give and take at once; the bound holds throughout.
TEST(CopyListPoolTest, ThreadsGiveAndTakeAtOnce) {
  CopyListPool pool(/*max_bytes=*/64 * 1024 * sizeof(Copy));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 500; ++i) {
        CopyList list = pool.Take();
        list.Extend(static_cast<size_t>(1024 * (1 + (i + t) % 8)));
        pool.Give(std::move(list));
        EXPECT_LE(pool.idle_bytes(), 64u * 1024 * sizeof(Copy));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_GE(pool.idle_lists(), 1u);
}

}  // namespace
}  // namespace kvrail::transfer
