#include "control/sidecar/strand_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvrail::sidecar {
namespace {

TEST(StrandPoolTest, JobsOfOneKeyRunInOrderOneAtATime) {
  StrandPool pool(4, "test");
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> running{0};
  std::atomic<int> overlap{0};
  for (int i = 0; i < 200; ++i) {
    pool.Post("peer", [&, i] {
      if (running.fetch_add(1) != 0) overlap.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }
      running.fetch_sub(1);
    });
  }
  pool.Stop();
  EXPECT_EQ(overlap.load(), 0);
  ASSERT_EQ(order.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
  EXPECT_EQ(pool.strands(), 0u) << "an idle strand was kept";
}

// The point of the pool: one peer whose job blocks holds its own strand only.
TEST(StrandPoolTest, ABlockedKeyDoesNotDelayOthers) {
  StrandPool pool(2, "test");
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  bool other_ran = false;
  pool.Post("stuck", [&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
  });
  pool.Post("stuck", [] {});  // queued behind the stuck job
  pool.Post("healthy", [&] {
    std::lock_guard<std::mutex> lock(mu);
    other_ran = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return other_ran; });
    // "healthy"'s strand is erased once its job has returned, just after it signalled here.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pool.strands() != 1u && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(pool.strands(), 1u);  // only "stuck" is left
    release = true;
    cv.notify_all();
  }
  pool.Stop();
}

// A thread runs its strand's next job itself, but not ahead of a strand waiting for a thread:
// a peer that always has more jobs does not starve another peer of a one-thread pool.
TEST(StrandPoolTest, ABusyStrandTakesTurnsWithOneWaiting) {
  StrandPool pool(1, "test");
  std::mutex mu;
  std::condition_variable cv;
  bool other_posted = false;
  std::atomic<int> busy_jobs{0};
  std::atomic<int> busy_jobs_before_other{-1};
  std::function<void()> busy = [&] {
    if (busy_jobs.fetch_add(1) == 0) {  // the first waits until "other" is queued
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return other_posted; });
    }
    if (busy_jobs.load() < 1000) pool.Post("busy", busy);
  };
  pool.Post("busy", busy);
  pool.Post("other", [&] { busy_jobs_before_other.store(busy_jobs.load()); });
  {
    std::lock_guard<std::mutex> lock(mu);
    other_posted = true;
  }
  cv.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (busy_jobs.load() < 1000 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  pool.Stop();
  EXPECT_EQ(busy_jobs.load(), 1000);
  EXPECT_EQ(busy_jobs_before_other.load(), 1) << "the waiting strand ran only after the busy one";
}

TEST(StrandPoolTest, JobsPostedAfterStopAreDropped) {
  StrandPool pool(1, "test");
  pool.Stop();
  bool ran = false;
  pool.Post("k", [&] { ran = true; });
  pool.Stop();
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace kvrail::sidecar
