#include "control/sidecar/owner_loop.h"

#include <poll.h>
#include <pthread.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvrail::sidecar {
namespace {

TEST(OwnerLoopTest, JobsRunOneAtATimeInTheOrderTheyWerePosted) {
  OwnerLoop loop("kvrail-test");
  std::vector<int> ran;  // touched by the owner thread only: no lock
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(loop.Post([&ran, i] { ran.push_back(i); }));
  loop.Stop();
  ASSERT_EQ(ran.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(ran[i], i);
}

TEST(OwnerLoopTest, JobsFromManyThreadsNeverOverlap) {
  OwnerLoop loop("kvrail-test");
  int64_t counter = 0;  // unguarded on purpose: TSan reports any two jobs that overlap
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) loop.Post([&counter] { ++counter; });
    });
  }
  for (std::thread& poster : posters) poster.join();
  EXPECT_EQ(loop.Call([&counter] { return counter; }), std::optional<int64_t>(4000));
}

TEST(OwnerLoopTest, CallAnswersWithWhatTheJobReturnedAndRunsItOnTheOwner) {
  OwnerLoop loop("kvrail-test");
  EXPECT_FALSE(loop.OnOwner());
  EXPECT_EQ(loop.Call([&loop] { return loop.OnOwner(); }), std::optional<bool>(true));
  std::optional<std::monostate> done = loop.Call([] {});
  EXPECT_TRUE(done.has_value());
}

TEST(OwnerLoopTest, ACallFromTheOwnerThreadRunsInPlaceInsteadOfWaitingForItself) {
  OwnerLoop loop("kvrail-test");
  const std::optional<int> outer = loop.Call([&loop] {
    const std::optional<int> inner = loop.Call([] { return 7; });
    return inner.value_or(-1) + 1;
  });
  EXPECT_EQ(outer, std::optional<int>(8));
}

TEST(OwnerLoopTest, AJobsFollowUpRunsAfterTheJobsAlreadyQueued) {
  OwnerLoop loop("kvrail-test");
  std::vector<std::string> ran;
  std::atomic<bool> release{false};
  loop.Post([&] {
    while (!release.load()) std::this_thread::yield();  // hold the owner while more is posted
    ran.push_back("first");
    loop.Post([&ran] { ran.push_back("follow-up"); });
  });
  loop.Post([&ran] { ran.push_back("second"); });
  release = true;
  loop.Stop();
  EXPECT_EQ(ran, (std::vector<std::string>{"first", "second", "follow-up"}));
}

TEST(OwnerLoopTest, StopRunsWhatWasPostedThenRefusesMore) {
  OwnerLoop loop("kvrail-test");
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) loop.Post([&ran] { ++ran; });
  loop.Stop();
  EXPECT_EQ(ran.load(), 10);
  EXPECT_FALSE(loop.Post([&ran] { ++ran; }));
  EXPECT_EQ(loop.Call([] { return 1; }), std::nullopt);
  EXPECT_EQ(loop.queued(), 0u);
  loop.Stop();  // idempotent
  EXPECT_EQ(ran.load(), 10);
}

TEST(OwnerLoopTest, TheThreadCarriesItsName) {
  OwnerLoop loop("kvrail-room-owner-long");
  const std::optional<std::string> name = loop.Call([] {
    char buffer[16] = {};
    pthread_getname_np(pthread_self(), buffer, sizeof(buffer));
    return std::string(buffer);
  });
  EXPECT_EQ(name, std::optional<std::string>("kvrail-room-own"));  // 15 characters kept
}

// A driven loop: another thread (a sidecar's engine API) polls the eventfd and runs the jobs.
class Driver {
 public:
  explicit Driver(OwnerLoop& loop) : loop_(loop) {
    thread_ = std::thread([this] {
      loop_.Adopt();
      while (!stop_.load()) {
        pollfd fd{loop_.wake_fd(), POLLIN, 0};
        if (poll(&fd, 1, 10) > 0) loop_.RunPending();
      }
      loop_.RunPending();  // what was left at Stop
    });
  }
  void Stop() {
    loop_.Stop();
    stop_.store(true);
    thread_.join();
  }
  std::thread::id id() const { return thread_.get_id(); }

 private:
  OwnerLoop& loop_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(OwnerLoopTest, ADrivenLoopRunsItsJobsInOrderOnTheThreadThatDrivesIt) {
  OwnerLoop loop{OwnerLoop::Driven{}};
  Driver driver(loop);
  std::vector<int> order;
  std::atomic<int> off_driver{0};
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(loop.Post([&, i] {
      if (std::this_thread::get_id() != driver.id()) off_driver.fetch_add(1);
      order.push_back(i);
    }));
  }
  const std::optional<int> answer = loop.Call([&] { return static_cast<int>(order.size()); });
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(*answer, 1000);
  EXPECT_EQ(off_driver.load(), 0);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
  // Posted before Stop: run by the driver's last RunPending. After: dropped.
  bool ran = false;
  ASSERT_TRUE(loop.Post([&] { ran = true; }));
  driver.Stop();
  EXPECT_TRUE(ran);
  EXPECT_FALSE(loop.Post([] {}));
  EXPECT_FALSE(loop.Call([] { return 1; }).has_value());
}

}  // namespace
}  // namespace kvrail::sidecar
