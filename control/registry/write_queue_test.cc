#include "control/registry/write_queue.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrail::registry {
namespace {

using Written = std::pair<std::string, std::string>;

// A registry stand-in: records each write; while `held`, a write waits (inside the write
// function, as a slow etcd would) until Release; `failures` writes fail before one succeeds.
class FakeRegistry {
 public:
  absl::Status Write(const std::string& key, const std::string& value) {
    std::unique_lock<std::mutex> lock(mu_);
    ++attempts_;
    entered_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return !held_; });
    if (failures_ > 0) {
      --failures_;
      return absl::UnavailableError("etcd at fake: PUT: connection refused");
    }
    writes_.emplace_back(key, value);
    return absl::OkStatus();
  }
  WriteQueue::WriteFn Fn() {
    return [this](const std::string& key, const std::string& value) { return Write(key, value); };
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = true;
    entered_ = false;
  }
  // Waits until a write has entered the (held) write function.
  void AwaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return entered_; });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = false;
    }
    changed_.notify_all();
  }
  void Fail(int times) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_ = times;
  }
  std::vector<Written> writes() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  int attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return attempts_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool held_ = false;
  bool entered_ = false;
  int failures_ = 0;
  int attempts_ = 0;
  std::vector<Written> writes_;
};

WriteQueueOptions Fast() {
  WriteQueueOptions options;
  options.what = "test writer";
  options.first_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(8);
  return options;
}

TEST(WriteQueueTest, WritesKeysInTheOrderTheyWerePut) {
  FakeRegistry registry;
  WriteQueue queue(registry.Fn(), Fast());
  ASSERT_TRUE(queue.Put("a", "1"));
  ASSERT_TRUE(queue.Put("b", "2"));
  ASSERT_TRUE(queue.Put("c", "3"));
  ASSERT_TRUE(queue.AwaitEmpty(absl::Seconds(10)));
  EXPECT_EQ(registry.writes(), (std::vector<Written>{{"a", "1"}, {"b", "2"}, {"c", "3"}}));
}

TEST(WriteQueueTest, TheLatestValueOfAKeyReplacesAnUnwrittenOneInItsPlace) {
  FakeRegistry registry;
  registry.Hold();
  WriteQueue queue(registry.Fn(), Fast());
  queue.Put("first", "x");
  registry.AwaitEntered();  // "first" is being written; the rest wait in line
  queue.Put("a", "1");
  queue.Put("b", "1");
  queue.Put("a", "2");
  queue.Put("a", "3");
  EXPECT_EQ(queue.size(), 3u);
  registry.Release();
  ASSERT_TRUE(queue.AwaitEmpty(absl::Seconds(10)));
  EXPECT_EQ(registry.writes(), (std::vector<Written>{{"first", "x"}, {"a", "3"}, {"b", "1"}}));
}

TEST(WriteQueueTest, AValuePutWhileItsKeyIsWrittenIsWrittenAfterIt) {
  FakeRegistry registry;
  registry.Hold();
  WriteQueue queue(registry.Fn(), Fast());
  queue.Put("a", "1");
  registry.AwaitEntered();
  queue.Put("a", "2");
  registry.Release();
  ASSERT_TRUE(queue.AwaitEmpty(absl::Seconds(10)));
  EXPECT_EQ(registry.writes(), (std::vector<Written>{{"a", "1"}, {"a", "2"}}));
}

TEST(WriteQueueTest, HoldsNoMoreEntriesThanDistinctKeys) {
  FakeRegistry registry;
  registry.Hold();
  WriteQueue queue(registry.Fn(), Fast());
  queue.Put("held", "x");
  registry.AwaitEntered();
  for (int i = 0; i < 10000; ++i) queue.Put("rank/" + std::to_string(i % 8), std::to_string(i));
  EXPECT_EQ(queue.size(), 9u);
  registry.Release();
  ASSERT_TRUE(queue.AwaitEmpty(absl::Seconds(10)));
  EXPECT_EQ(registry.writes().size(), 9u);
  EXPECT_EQ(registry.writes().back(), Written("rank/7", "9999"));
}

TEST(WriteQueueTest, PutNeverWaitsForAWriteInProgress) {
  FakeRegistry registry;
  registry.Hold();  // a registry that does not answer
  WriteQueue queue(registry.Fn(), Fast());
  queue.Put("a", "1");
  registry.AwaitEntered();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(queue.Put("b", std::to_string(i)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_FALSE(queue.AwaitWritten("a", absl::Milliseconds(20)));
  registry.Release();
}

TEST(WriteQueueTest, AFailedWriteIsRetriedAheadOfTheRestUntilItLands) {
  FakeRegistry registry;
  registry.Fail(3);
  WriteQueue queue(registry.Fn(), Fast());
  queue.Put("a", "1");
  queue.Put("b", "2");
  ASSERT_TRUE(queue.AwaitWritten("a", absl::Seconds(10)));
  ASSERT_TRUE(queue.AwaitEmpty(absl::Seconds(10)));
  EXPECT_EQ(registry.attempts(), 5);  // a: three failures and a success; b: one
  EXPECT_EQ(registry.writes(), (std::vector<Written>{{"a", "1"}, {"b", "2"}}));
}

TEST(WriteQueueTest, RetriesBackOff) {
  FakeRegistry registry;
  registry.Fail(4);
  WriteQueueOptions options = Fast();
  options.first_backoff = absl::Milliseconds(40);
  options.max_backoff = absl::Milliseconds(80);
  WriteQueue queue(registry.Fn(), options);
  const absl::Time start = absl::Now();
  queue.Put("a", "1");
  ASSERT_TRUE(queue.AwaitEmpty(absl::Seconds(10)));
  // Waits of 40, 80, 80 and 80 ms between the five attempts.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(280));
  EXPECT_EQ(registry.attempts(), 5);
}

TEST(WriteQueueTest, StopFlushesWhatIsQueued) {
  FakeRegistry registry;
  registry.Fail(2);
  WriteQueue queue(registry.Fn(), Fast());
  for (int i = 0; i < 5; ++i) queue.Put("k" + std::to_string(i), "v");
  EXPECT_EQ(queue.Stop(absl::Seconds(10)), 0u);
  EXPECT_EQ(registry.writes().size(), 5u);
}

TEST(WriteQueueTest, StopGivesUpAtItsDeadlineWhenTheRegistryStaysAway) {
  FakeRegistry registry;
  registry.Fail(1 << 30);
  WriteQueueOptions options = Fast();
  options.max_backoff = absl::Seconds(2);  // longer than the deadline: Stop cuts the wait short
  WriteQueue queue(registry.Fn(), options);
  queue.Put("a", "1");
  queue.Put("b", "1");
  const absl::Time start = absl::Now();
  EXPECT_EQ(queue.Stop(absl::Milliseconds(300)), 2u);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_TRUE(registry.writes().empty());
}

TEST(WriteQueueTest, PutAfterStopIsRefused) {
  FakeRegistry registry;
  WriteQueue queue(registry.Fn(), Fast());
  queue.Stop(absl::Seconds(1));
  EXPECT_FALSE(queue.Put("a", "1"));
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_EQ(queue.Stop(absl::Seconds(1)), 0u);
}

}  // namespace
}  // namespace kvrail::registry
