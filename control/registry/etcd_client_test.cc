#include "control/registry/etcd_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "absl/time/clock.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/etcd_process.h"
#include "tests/support/ports.h"

namespace kvrail::registry {
namespace {

using ::testing::HasSubstr;

class EtcdClientTest : public EtcdFixture {};

TEST(ParseRegistryUrlTest, AcceptsEtcdHostPort) {
  auto parsed = ParseRegistryUrl("etcd://127.0.0.1:2379");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, "127.0.0.1:2379");
}

TEST(ParseRegistryUrlTest, RefusesOtherSchemesAndPortsNamingTheRule) {
  EXPECT_THAT(std::string(ParseRegistryUrl("http://h:1").status().message()),
              HasSubstr("--registry http://h:1: the scheme must be etcd://"));
  EXPECT_THAT(std::string(ParseRegistryUrl("etcd://h:99999").status().message()),
              HasSubstr("the port must be"));
  EXPECT_THAT(std::string(ParseRegistryUrl("etcd://h").status().message()),
              HasSubstr("a host and a port"));
  EXPECT_THAT(std::string(ParseRegistryUrl("etcd://h/x:1").status().message()),
              HasSubstr("the host may hold only"));
}

TEST_F(EtcdClientTest, PutThenGetReturnsTheValue) {
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put("/t/get/a", std::string("v\0x", 3)).ok());
  auto got = client.Get("/t/get/a");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, std::string("v\0x", 3));
  EXPECT_GT((*got)->mod_revision, 0);
  auto absent = client.Get("/t/get/none");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->has_value());
}

TEST_F(EtcdClientTest, ListReturnsOnlyKeysUnderThePrefix) {
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put("/t/list/a", "1").ok());
  ASSERT_TRUE(client.Put("/t/list/b", "2").ok());
  ASSERT_TRUE(client.Put("/t/listx", "3").ok());
  int64_t revision = 0;
  auto listed = client.List("/t/list/", &revision);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "/t/list/a");
  EXPECT_EQ((*listed)[1].key, "/t/list/b");
  EXPECT_GT(revision, 0);
}

TEST_F(EtcdClientTest, DeleteWithPrefixDeletesEveryKeyUnderIt) {
  EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put("/t/del/a", "1").ok());
  ASSERT_TRUE(client.Put("/t/del/b", "2").ok());
  auto deleted = client.Delete("/t/del/", /*prefix=*/true);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);
  EXPECT_TRUE(client.List("/t/del/")->empty());
}

TEST_F(EtcdClientTest, RevokedLeaseDeletesItsKeysAndCannotBeRenewed) {
  EtcdClient client(endpoint());
  auto lease = client.GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client.Put("/t/lease/a", "1", *lease).ok());
  EXPECT_EQ((*client.Get("/t/lease/a"))->lease, *lease);
  auto renewed = client.KeepAlive(*lease);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, absl::Seconds(30));
  ASSERT_TRUE(client.RevokeLease(*lease).ok());
  EXPECT_FALSE(client.Get("/t/lease/a")->has_value());
  EXPECT_TRUE(absl::IsNotFound(client.KeepAlive(*lease).status()));
  EXPECT_TRUE(client.RevokeLease(*lease).ok());  // already gone
}

TEST_F(EtcdClientTest, ExpiredLeaseDeletesItsKeys) {
  EtcdClient client(endpoint());
  auto lease = client.GrantLease(absl::Seconds(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client.Put("/t/expire/a", "1", *lease).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && (*client.Get("/t/expire/a")).has_value()) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_FALSE(client.Get("/t/expire/a")->has_value());
}

TEST_F(EtcdClientTest, PutToAnUnknownLeaseNamesEtcdsMessage) {
  EtcdClient client(endpoint());
  auto put = client.Put("/t/bad", "1", 12345);
  EXPECT_TRUE(absl::IsNotFound(put.status())) << put.status();
  EXPECT_THAT(std::string(put.status().message()),
              HasSubstr(absl::StrCat("etcd at ", endpoint(), ": put /t/bad answered")));
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("requested lease not found"));
}

TEST(EtcdClientDownTest, ErrorsNameTheEndpointAndTheCall) {
  auto port = testing::FreePort();
  ASSERT_TRUE(port.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  EtcdClient client(endpoint, absl::Milliseconds(500));
  absl::Status health = client.Health();
  EXPECT_TRUE(absl::IsUnavailable(health));
  EXPECT_THAT(std::string(health.message()), HasSubstr("etcd at " + endpoint + ": GET /health"));
  auto put = client.Put("/k", "v");
  EXPECT_TRUE(absl::IsUnavailable(put.status()));
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("etcd at " + endpoint + ": put /k"));
}

}  // namespace
}  // namespace kvrail::registry
