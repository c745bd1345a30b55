#include "control/registry/prefix_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "control/registry/etcd_client.h"
#include "control/registry/etcd_fixture.h"
#include "control/registry/etcd_process.h"

namespace kvrail::registry {
namespace {

using ::testing::HasSubstr;

// What a watcher handed on, for the test thread to wait on.
class Seen {
 public:
  PrefixWatcher::Handler handler() {
    return [this](const WatchEvent& event) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    };
  }
  // Waits for an event of `type` for `key` (and `value`, unless empty).
  bool Await(WatchEvent::Type type, const std::string& key, const std::string& value = "",
             absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    const auto found = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (const WatchEvent& event : events_) {
        if (event.type == type && event.key == key && (value.empty() || event.value == value)) {
          return true;
        }
      }
      return false;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&found), timeout);
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return events_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
};

class PrefixWatcherTest : public EtcdFixture {};

TEST_F(PrefixWatcherTest, KeysPresentAtStartAreHandedOnBeforeStartReturns) {
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put("/t/w1/a", "1").ok());
  Seen seen;
  auto watcher = PrefixWatcher::Start(endpoint(), "/t/w1/", seen.handler());
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EXPECT_EQ(seen.count(), 1u);
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kPut, "/t/w1/a", "1", absl::ZeroDuration()));
}

TEST_F(PrefixWatcherTest, PutsAndDeletesUnderThePrefixAreHandedOn) {
  Seen seen;
  auto watcher =
      PrefixWatcher::Start(endpoint(), "/t/w2/", seen.handler(), absl::Milliseconds(300));
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put("/t/w2/a", "1").ok());
  ASSERT_TRUE(client.Put("/t/w2x", "outside").ok());
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kPut, "/t/w2/a", "1"));
  // Past a reconnect: nothing is lost or repeated between streams.
  absl::SleepFor(absl::Milliseconds(700));
  ASSERT_TRUE(client.Put("/t/w2/a", "2").ok());
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kPut, "/t/w2/a", "2"));
  ASSERT_TRUE(client.Delete("/t/w2/a").ok());
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kDelete, "/t/w2/a"));
  EXPECT_EQ(seen.count(), 3u);
  EXPECT_GE((*watcher)->streams_opened(), 2u);
}

TEST_F(PrefixWatcherTest, AnExpiredLeaseIsADelete) {
  Seen seen;
  auto watcher = PrefixWatcher::Start(endpoint(), "/t/w3/", seen.handler());
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EtcdClient client(endpoint());
  auto lease = client.GrantLease(absl::Seconds(1));
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client.Put("/t/w3/a", "1", *lease).ok());
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kPut, "/t/w3/a"));
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kDelete, "/t/w3/a"));
}

TEST_F(PrefixWatcherTest, StopReturnsPromptlyWhileAStreamIsOpen) {
  Seen seen;
  auto watcher = PrefixWatcher::Start(endpoint(), "/t/w4/", seen.handler(), absl::Seconds(30));
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  absl::SleepFor(absl::Milliseconds(200));
  (*watcher)->Stop();  // must not wait 30 s for the stream's read timeout
  SUCCEED();
}

TEST(PrefixWatcherDownTest, StartFailsNamingTheEndpoint) {
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  Seen seen;
  auto watcher = PrefixWatcher::Start(endpoint, "/t/", seen.handler());
  EXPECT_TRUE(absl::IsUnavailable(watcher.status()));
  EXPECT_THAT(std::string(watcher.status().message()), HasSubstr("etcd at " + endpoint));
}

}  // namespace
}  // namespace kvrail::registry
