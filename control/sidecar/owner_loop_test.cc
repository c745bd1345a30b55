#include "control/sidecar/owner_loop.h"

#include <pthread.h>

#include <atomic>
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

}  // namespace
}  // namespace kvrail::sidecar
