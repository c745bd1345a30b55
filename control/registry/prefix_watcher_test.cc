#include "control/registry/prefix_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/registry/etcd_client.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/etcd_process.h"
#include "tests/support/ports.h"

namespace kvrail::registry {
namespace {

using ::testing::HasSubstr;

// What a watcher handed on, for the test thread to wait on.
class Seen {
 public:
  PrefixWatcher::Handler handler() {
    return [this](const WatchEvent& event) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(event);
      }
      grew_.notify_all();
    };
  }
  // Waits for an event of `type` for `key` (and `value`, unless empty).
  bool Await(WatchEvent::Type type, const std::string& key, const std::string& value = "",
             absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return grew_.wait_for(lock, absl::ToChronoMicroseconds(timeout), [&] {
      for (const WatchEvent& event : events_) {
        if (event.type == type && event.key == key && (value.empty() || event.value == value)) {
          return true;
        }
      }
      return false;
    });
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_.size();
  }

 private:
  std::mutex mu_;  // std::mutex: TSan sees it (Debian's absl is not instrumented)
  std::condition_variable grew_;
  std::vector<WatchEvent> events_;  // guarded by mu_
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

// etcd compacts its history (--auto-compaction-retention in production): a watch reopened from a
// revision it no longer holds is cancelled. The watcher lists the prefix again and goes on,
// repeating nothing.
TEST_F(PrefixWatcherTest, AWatchCompactedAwayIsListedAgainAndGoesOn) {
  Seen seen;
  auto watcher =
      PrefixWatcher::Start(endpoint(), "/t/w5/", seen.handler(), absl::Milliseconds(300));
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put("/t/w5/a", "1").ok());
  ASSERT_TRUE(seen.Await(WatchEvent::Type::kPut, "/t/w5/a", "1"));
  // Writes elsewhere move the store on; compacted there, the watcher's next stream (reopened
  // within 300 ms from the revision after /t/w5/a) has nothing to start from.
  int64_t revision = 0;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<int64_t> put = client.Put("/t/elsewhere", absl::StrCat(i));
    ASSERT_TRUE(put.ok()) << put.status();
    revision = *put;
  }
  const uint64_t relists = (*watcher)->relists();
  const absl::Status compacted = client.Compact(revision);
  ASSERT_TRUE(compacted.ok()) << compacted;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*watcher)->relists() == relists && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GT((*watcher)->relists(), relists);
  ASSERT_TRUE(client.Put("/t/w5/b", "2").ok());
  EXPECT_TRUE(seen.Await(WatchEvent::Type::kPut, "/t/w5/b", "2"));
  EXPECT_EQ(seen.count(), 2u);  // a once, b once
}

TEST_F(PrefixWatcherTest, StopEndsAnOpenStream) {
  Seen seen;
  auto watcher = PrefixWatcher::Start(endpoint(), "/t/w4/", seen.handler());
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  absl::SleepFor(absl::Milliseconds(200));
  (*watcher)->Stop();  // within the read timeout of the stream it is reading
  SUCCEED();
}

TEST(PrefixWatcherDownTest, StartFailsNamingTheEndpoint) {
  auto port = testing::FreePort();
  ASSERT_TRUE(port.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  Seen seen;
  auto watcher = PrefixWatcher::Start(endpoint, "/t/", seen.handler());
  EXPECT_TRUE(absl::IsUnavailable(watcher.status()));
  EXPECT_THAT(std::string(watcher.status().message()), HasSubstr("etcd at " + endpoint));
}

}  // namespace
}  // namespace kvrail::registry
