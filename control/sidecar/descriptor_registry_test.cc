#include "control/sidecar/descriptor_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "control/registry/etcd_client.h"
#include "control/registry/keys.h"
#include "tests/support/etcd_fixture.h"
#include "tests/support/ports.h"

namespace kvrail::sidecar {
namespace {

using ::testing::HasSubstr;

class DescriptorRegistryTest : public registry::EtcdFixture {};

v1::HandshakeDescriptor Descriptor(uint64_t version) {
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(version);
  descriptor.set_cachepd_endpoint("tcp://127.0.0.1:5000");
  return descriptor;
}

// What the hooks were told, for the test thread to wait on.
struct Told {
  std::mutex mu;  // std::mutex: TSan sees it (Debian's absl is not instrumented)
  std::condition_variable grew;
  std::vector<std::string> changed;  // guarded by mu
  std::vector<std::string> gone;     // reasons, guarded by mu
  RegistryDescriptors::Hooks Hooks() {
    return {[this](const std::string& session) { Add(&changed, session); },
            [this](const std::string&, const std::string& reason) { Add(&gone, reason); }};
  }
  void Add(std::vector<std::string>* list, const std::string& text) {
    {
      std::lock_guard<std::mutex> lock(mu);
      list->push_back(text);
    }
    grew.notify_all();
  }
  bool Await(std::vector<std::string>* list, size_t count) {
    std::unique_lock<std::mutex> lock(mu);
    return grew.wait_for(lock, std::chrono::seconds(10), [&] { return list->size() >= count; });
  }
};

// Polls `lookup` until it has a descriptor of `version`.
bool AwaitVersion(RegistryDescriptors& descriptors, const std::string& session, uint64_t version) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto found = descriptors.Lookup(session);
    if (found.has_value() && found->version() == version) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST_F(DescriptorRegistryTest, APublishedDescriptorIsFoundWithoutAHandshake) {
  Told told;
  auto descriptors = RegistryDescriptors::Start(endpoint(), told.Hooks());
  ASSERT_TRUE(descriptors.ok()) << descriptors.status();
  auto publisher = DescriptorPublisher::Start(endpoint(), absl::Seconds(10), "127.0.0.1:4711", 0);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  EXPECT_FALSE((*descriptors)->Lookup("127.0.0.1:4711").has_value());
  (*publisher)->Offer(Descriptor(1));
  EXPECT_TRUE(AwaitVersion(**descriptors, "127.0.0.1:4711", 1));
  EXPECT_GE((*descriptors)->hits(), 1u);
}

TEST_F(DescriptorRegistryTest, ANewDescriptorIsANewVersionAndTellsTheHook) {
  Told told;
  auto descriptors = RegistryDescriptors::Start(endpoint(), told.Hooks());
  ASSERT_TRUE(descriptors.ok()) << descriptors.status();
  auto publisher = DescriptorPublisher::Start(endpoint(), absl::Seconds(10), "127.0.0.1:4712", 0);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Offer(Descriptor(1));
  (*publisher)->Offer(Descriptor(1));  // unchanged: not published again
  ASSERT_TRUE(AwaitVersion(**descriptors, "127.0.0.1:4712", 1));
  (*publisher)->Offer(Descriptor(2));
  ASSERT_TRUE(told.Await(&told.changed, 1));
  EXPECT_TRUE(AwaitVersion(**descriptors, "127.0.0.1:4712", 2));
  registry::EtcdClient client(endpoint());
  auto entry = registry::DecodeSessionEntry(
      "k", (*client.Get(registry::SessionKey("127.0.0.1:4712")))->value);
  ASSERT_TRUE(entry.ok()) << entry.status();
  EXPECT_EQ(entry->version, 2);
}

TEST_F(DescriptorRegistryTest, ADeletedEntryIsGoneWithAReasonNamingTheKeyAndTtl) {
  Told told;
  auto descriptors = RegistryDescriptors::Start(endpoint(), told.Hooks());
  ASSERT_TRUE(descriptors.ok()) << descriptors.status();
  auto publisher = DescriptorPublisher::Start(endpoint(), absl::Seconds(7), "127.0.0.1:4713", 0);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Offer(Descriptor(1));
  ASSERT_TRUE(AwaitVersion(**descriptors, "127.0.0.1:4713", 1));
  (*publisher)->Stop();  // revokes the lease
  ASSERT_TRUE(told.Await(&told.gone, 1));
  std::lock_guard<std::mutex> lock(told.mu);
  EXPECT_THAT(told.gone[0], HasSubstr("decode session 127.0.0.1:4713's registry entry "
                                      "/kvrail/v1/sessions/127.0.0.1:4713 expired"));
  EXPECT_THAT(told.gone[0], HasSubstr("(lease ttl 7 s)"));
  EXPECT_FALSE((*descriptors)->Lookup("127.0.0.1:4713").has_value());
}

TEST_F(DescriptorRegistryTest, AMalformedEntryIsIgnored) {
  Told told;
  auto descriptors = RegistryDescriptors::Start(endpoint(), told.Hooks());
  ASSERT_TRUE(descriptors.ok()) << descriptors.status();
  registry::EtcdClient client(endpoint());
  ASSERT_TRUE(client.Put(registry::SessionKey("127.0.0.1:4714"), "not json").ok());
  ASSERT_TRUE(client
                  .Put(registry::SessionKey("127.0.0.1:4715"),
                       R"({"descriptor":"/w==","version":1,"role":"decode","tp_rank":0})")
                  .ok());
  auto publisher = DescriptorPublisher::Start(endpoint(), absl::Seconds(10), "127.0.0.1:4716", 0);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  (*publisher)->Offer(Descriptor(3));  // a good one after the bad ones: they were passed over
  ASSERT_TRUE(AwaitVersion(**descriptors, "127.0.0.1:4716", 3));
  EXPECT_FALSE((*descriptors)->Lookup("127.0.0.1:4714").has_value());
  EXPECT_FALSE((*descriptors)->Lookup("127.0.0.1:4715").has_value());
}

TEST(DescriptorRegistryDownTest, ARegistryDownAtStartIsAnErrorNamingIt) {
  auto port = testing::FreePort();
  ASSERT_TRUE(port.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  auto descriptors = RegistryDescriptors::Start(endpoint, {});
  EXPECT_THAT(std::string(descriptors.status().message()), HasSubstr("etcd at " + endpoint));
  auto publisher = DescriptorPublisher::Start(endpoint, absl::Seconds(10), "127.0.0.1:1", 0);
  EXPECT_THAT(std::string(publisher.status().message()), HasSubstr("etcd at " + endpoint));
}

}  // namespace
}  // namespace kvrail::sidecar
