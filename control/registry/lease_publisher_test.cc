#include "control/registry/lease_publisher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "absl/time/clock.h"
#include "control/registry/etcd_client.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/etcd_process.h"
#include "tests/support/ports.h"

namespace kvrail::registry {
namespace {

using ::testing::HasSubstr;

class LeasePublisherTest : public EtcdFixture {};

TEST_F(LeasePublisherTest, PublishedKeysAreLeasedAndGoOnStop) {
  auto publisher = LeasePublisher::Start(endpoint(), absl::Seconds(30));
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Publish("/t/pub/a", "1");
  ASSERT_TRUE((*publisher)->AwaitWritten(absl::Seconds(10)));
  EtcdClient client(endpoint());
  auto got = client.Get("/t/pub/a");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, "1");
  EXPECT_EQ((*got)->lease, (*publisher)->lease());
  (*publisher)->Stop();
  EXPECT_FALSE(client.Get("/t/pub/a")->has_value());
}

TEST_F(LeasePublisherTest, PublishingAgainReplacesTheValue) {
  auto publisher = LeasePublisher::Start(endpoint(), absl::Seconds(30));
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Publish("/t/pub/b", "1");
  (*publisher)->Publish("/t/pub/b", "2");
  ASSERT_TRUE((*publisher)->AwaitWritten(absl::Seconds(10)));
  EtcdClient client(endpoint());
  EXPECT_EQ((*client.Get("/t/pub/b"))->value, "2");
}

TEST_F(LeasePublisherTest, KeysOutliveTheirTtlWhileRenewed) {
  auto publisher = LeasePublisher::Start(endpoint(), absl::Seconds(1));
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Publish("/t/pub/c", "1");
  ASSERT_TRUE((*publisher)->AwaitWritten(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(2500));
  EtcdClient client(endpoint());
  EXPECT_TRUE(client.Get("/t/pub/c")->has_value());
}

TEST_F(LeasePublisherTest, ALostLeaseIsGrantedAnewWithEveryKey) {
  auto publisher = LeasePublisher::Start(endpoint(), absl::Seconds(3));
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Publish("/t/pub/d", "1");
  ASSERT_TRUE((*publisher)->AwaitWritten(absl::Seconds(10)));
  const int64_t first = (*publisher)->lease();
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.RevokeLease(first).ok());  // as etcd does when the lease timed out
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::optional<KeyValue> kv;
  while (absl::Now() < deadline) {
    kv = *client.Get("/t/pub/d");
    if (kv.has_value()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(kv.has_value());
  EXPECT_NE(kv->lease, first);
}

TEST(LeasePublisherDownTest, StartFailsNamingTheEndpoint) {
  auto port = testing::FreePort();
  ASSERT_TRUE(port.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  auto publisher = LeasePublisher::Start(endpoint, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(publisher.status()));
  EXPECT_THAT(std::string(publisher.status().message()), HasSubstr("etcd at " + endpoint));
}

}  // namespace
}  // namespace kvrail::registry
