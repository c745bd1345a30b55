#include "engine/transfer/peer_directory.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/transport/loopback/loopback_transport.h"

namespace kvrail::transfer {
namespace {

using transport::DescriptorCache;
using transport::HandshakeServer;
using transport::LoopbackTransport;

struct Fixture {
  Fixture() {
    sender = LoopbackTransport::Create().value();
    receiver = LoopbackTransport::Create().value();
    EXPECT_TRUE(receiver->Register({first.data(), first.size()}).ok());
    server = HandshakeServer::Start("127.0.0.1", 0, [this] {
               return receiver->LocalDescriptor();
             }).value();
  }
  std::vector<uint8_t> first = std::vector<uint8_t>(4096);
  std::vector<uint8_t> second = std::vector<uint8_t>(4096);
  std::unique_ptr<LoopbackTransport> sender;
  std::unique_ptr<LoopbackTransport> receiver;
  std::unique_ptr<HandshakeServer> server;
  DescriptorCache cache{absl::Seconds(5)};
};

TEST(PeerDirectoryTest, ConnectsOncePerSession) {
  Fixture f;
  PeerDirectory directory(f.sender.get(), &f.cache);
  auto link = directory.Get(f.server->session_id());
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->regions->size(), 1);
  auto again = directory.Get(f.server->session_id());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->peer, link->peer);
  EXPECT_EQ(directory.connects(), 1u);
  EXPECT_EQ(f.cache.fetches(), 1u);
}

TEST(PeerDirectoryTest, RefreshReconnectsOnlyWhenTheVersionChangedOrTheLinkFailed) {
  Fixture f;
  PeerDirectory directory(f.sender.get(), &f.cache);
  const PeerLink link = directory.Get(f.server->session_id()).value();
  // Same version: the link stays.
  auto same = directory.Refresh(f.server->session_id());
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->peer, link.peer);
  // The decode registered more memory: a new version, a new connection that sees both regions.
  ASSERT_TRUE(f.receiver->Register({f.second.data(), f.second.size()}).ok());
  auto changed = directory.Refresh(f.server->session_id());
  ASSERT_TRUE(changed.ok());
  EXPECT_NE(changed->peer, link.peer);
  EXPECT_GT(changed->version, link.version);
  EXPECT_EQ(changed->regions->size(), 2);
  EXPECT_TRUE(changed->regions->Find(reinterpret_cast<uintptr_t>(f.second.data()), 16));
  // The old peer id is gone from the transport.
  EXPECT_EQ(f.sender->Flush(link.peer, 0, [](absl::Status) {}).code(), absl::StatusCode::kNotFound);
  // A failed connection reconnects even at the same version.
  auto failed = directory.Refresh(f.server->session_id(), /*connection_failed=*/true);
  ASSERT_TRUE(failed.ok());
  EXPECT_NE(failed->peer, changed->peer);
  EXPECT_EQ(directory.connects(), 3u);
}

TEST(PeerDirectoryTest, AnUnreachableSessionFailsNamingItAndIsRetriedAfterRetryAfter) {
  Fixture f;
  DescriptorCache quick(absl::Milliseconds(200));
  PeerDirectory directory(f.sender.get(), &quick, {.retry_after = absl::Milliseconds(100)});
  const std::string session = f.server->session_id();
  f.server->Stop();
  auto link = directory.Get(session);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find(session), std::string::npos) << link.status();
  f.server = HandshakeServer::Start("127.0.0.1", f.server->port(), [&] {
               return f.receiver->LocalDescriptor();
             }).value();
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_TRUE(directory.Get(session).ok());
}

TEST(PeerDirectoryTest, DropDisconnectsAndForgets) {
  Fixture f;
  PeerDirectory directory(f.sender.get(), &f.cache);
  const PeerLink link = directory.Get(f.server->session_id()).value();
  directory.Drop(f.server->session_id());
  EXPECT_EQ(f.sender->Flush(link.peer, 0, [](absl::Status) {}).code(), absl::StatusCode::kNotFound);
  auto again = directory.Get(f.server->session_id());
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->peer, link.peer);
  EXPECT_EQ(f.cache.fetches(), 2u);
  directory.Drop("10.9.9.9:1");  // unknown: no-op
}

// A dead peer costs its handshake timeout once; rooms queued behind it fail at once, and the
// failure is forgotten after retry_after or a Drop.
TEST(PeerDirectoryTest, AFailedHandshakeIsAnsweredAtOnceUntilRetryAfter) {
  Fixture f;
  int fetches = 0;
  DescriptorCache cache(absl::Seconds(5), [&](absl::string_view session) {
    ++fetches;
    return absl::StatusOr<v1::HandshakeDescriptor>(
        absl::DeadlineExceededError(absl::StrCat("nobody answered at ", session)));
  });
  PeerDirectory directory(f.sender.get(), &cache, {.retry_after = absl::Hours(1)});
  EXPECT_EQ(directory.Get("127.0.0.1:1").status().code(), absl::StatusCode::kDeadlineExceeded);
  const absl::Status again = directory.Get("127.0.0.1:1").status();
  EXPECT_EQ(again.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(again.message().find("remembered"), std::string::npos) << again;
  EXPECT_EQ(fetches, 1);
  directory.Drop("127.0.0.1:1");
  (void)directory.Get("127.0.0.1:1");
  EXPECT_EQ(fetches, 2);
  EXPECT_EQ(directory.size(), 0u);
}

}  // namespace
}  // namespace kvrail::transfer
