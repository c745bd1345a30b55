#include "engine/transport/handshake/handshake.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/support/silent_listener.h"

namespace kvrail::transport {
namespace {

v1::HandshakeDescriptor Descriptor(uint64_t version) {
  v1::HandshakeDescriptor d;
  d.set_version(version);
  d.set_transport(v1::TRANSPORT_KIND_LOOPBACK);
  d.add_lanes()->set_address("lane-0");
  auto* region = d.add_regions();
  region->set_base(0x10000);
  region->set_length(4096);
  region->set_remote_key("key");
  return d;
}

TEST(ParseSessionIdTest, AcceptsHostPortAndBracketedIpv6) {
  auto a = ParseSessionId("10.0.0.7:5000");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "10.0.0.7");
  EXPECT_EQ(a->port, 5000);
  auto b = ParseSessionId("[::1]:65535");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "[::1]");
  EXPECT_TRUE(ParseSessionId("decode-0.local:1").ok());
}

TEST(ParseSessionIdTest, RejectsEachRuleWithItsReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "1 to 512"},
      {std::string(513, 'a'), "1 to 512"},
      {"10.0.0.7", "<host>:<port>"},
      {":5000", "empty host"},
      {"10.0.0.7:0", "[1, 65535]"},
      {"10.0.0.7:65536", "[1, 65535]"},
      {"10.0.0.7:05000", "canonical"},
      {"10.0.0.7:+5", "canonical"},
      {"10.0.0.7:", "canonical"},
      {"bad host:5000", "letters, digits"},
      {"[zz]:5000", "IPv6"},
  };
  for (const auto& [input, reason] : cases) {
    auto parsed = ParseSessionId(input);
    ASSERT_FALSE(parsed.ok()) << input;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << input;
    EXPECT_NE(parsed.status().message().find(reason), std::string::npos)
        << input << ": " << parsed.status();
  }
}

TEST(HandshakeServerTest, ServesTheCurrentDescriptorUnderItsSessionId) {
  std::atomic<uint64_t> version{3};
  auto server = HandshakeServer::Start("127.0.0.1", 0, [&] { return Descriptor(version.load()); });
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->session_id(), absl::StrCat("127.0.0.1:", (*server)->port()));

  auto fetched = FetchDescriptor((*server)->session_id(), absl::Seconds(5));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->version(), 3u);
  EXPECT_EQ(fetched->session_id(), (*server)->session_id());
  EXPECT_EQ(fetched->regions(0).remote_key(), "key");

  version = 4;  // the transport registered more memory
  fetched = FetchDescriptor((*server)->session_id(), absl::Seconds(5));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->version(), 4u);
  EXPECT_EQ((*server)->requests_served(), 2u);
}

TEST(HandshakeServerTest, AnotherSessionIdIsRefusedNamingBoth) {
  auto server = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(1); });
  ASSERT_TRUE(server.ok()) << server.status();
  // Same endpoint, but the caller believes it belongs to another session: a stale address.
  auto other = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(1); });
  ASSERT_TRUE(other.ok());
  const std::string stale = absl::StrCat("localhost:", (*server)->port());
  auto fetched = FetchDescriptor(stale, absl::Seconds(5));
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(fetched.status().message().find((*server)->session_id()), std::string::npos);
  EXPECT_NE(fetched.status().message().find(stale), std::string::npos);
}

TEST(HandshakeServerTest, SourceErrorIsSentBackAsTheReason) {
  auto server =
      HandshakeServer::Start("127.0.0.1", 0, []() -> absl::StatusOr<v1::HandshakeDescriptor> {
        return absl::FailedPreconditionError("the arena is not attached yet");
      });
  ASSERT_TRUE(server.ok());
  auto fetched = FetchDescriptor((*server)->session_id(), absl::Seconds(5));
  ASSERT_FALSE(fetched.ok());
  EXPECT_NE(fetched.status().message().find("the arena is not attached yet"), std::string::npos)
      << fetched.status();
}

TEST(HandshakeServerTest, MalformedRequestsGetAnErrorAndServingGoesOn) {
  auto server = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(1); });
  ASSERT_TRUE(server.ok());
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect(absl::StrCat("tcp://127.0.0.1:", (*server)->port()));
  const std::vector<std::vector<std::string>> bad = {
      {"GET"}, {"kvrail.handshake.v0", (*server)->session_id()}, {std::string(2000, 'x')}};
  int answered = 0;
  for (const auto& request : bad) {
    std::vector<zmq::const_buffer> frames;
    for (const std::string& f : request) frames.push_back(zmq::buffer(f));
    ASSERT_TRUE(zmq::send_multipart(dealer, frames));
    if (request[0].size() > 1000) continue;  // over maxmsgsize: the server drops the peer
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(reply)));
    ASSERT_EQ(reply.size(), 3u);
    EXPECT_EQ(reply[1].to_string(), "error");
    ++answered;
  }
  EXPECT_EQ(answered, 2);
  auto fetched = FetchDescriptor((*server)->session_id(), absl::Seconds(5));
  EXPECT_TRUE(fetched.ok()) << fetched.status();
}

TEST(HandshakeServerTest, WildcardBindNeedsAnAdvertisedHost) {
  auto server = HandshakeServer::Start("0.0.0.0", 0, [] { return Descriptor(1); });
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("advertise host"), std::string::npos);
  server = HandshakeServer::Start(
      "0.0.0.0", 0, [] { return Descriptor(1); }, "127.0.0.1");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(FetchDescriptor((*server)->session_id(), absl::Seconds(5)).ok());
}

TEST(HandshakeServerTest, PortInUseIsUnavailableNamingTheEndpoint) {
  auto first = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(1); });
  ASSERT_TRUE(first.ok());
  auto second = HandshakeServer::Start("127.0.0.1", (*first)->port(), [] { return Descriptor(1); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(absl::StrCat("127.0.0.1:", (*first)->port())),
            std::string::npos);
}

TEST(FetchDescriptorTest, NobodyListeningIsDeadlineExceededNamingTheSession) {
  // Take a free port, then release it: nothing listens there any more.
  int port = 0;
  {
    auto server = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(1); });
    ASSERT_TRUE(server.ok());
    port = (*server)->port();
  }
  const std::string session = absl::StrCat("127.0.0.1:", port);
  auto fetched = FetchDescriptor(session, absl::Milliseconds(300));
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(fetched.status().message().find(session), std::string::npos);
}

TEST(FetchDescriptorTest, ABadSessionIdFailsBeforeAnyNetworking) {
  EXPECT_EQ(FetchDescriptor("no-port", absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FetchDescriptorsTest, AnswersEachSessionInOrderWithinOneTimeout) {
  auto one = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(1); });
  auto two = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(2); });
  ASSERT_TRUE(one.ok() && two.ok());
  test_support::SilentListener silent;
  ASSERT_TRUE(silent.bound());
  const std::string squatted = absl::StrCat("127.0.0.1:", silent.port());
  const absl::Time start = absl::Now();
  auto answers = FetchDescriptors({{(*one)->session_id()},
                                   {squatted},
                                   {"no-port"},
                                   {(*two)->session_id()},
                                   {squatted},
                                   {(*one)->session_id()}},
                                  absl::Milliseconds(400));
  // Two silent peers cost one timeout between them (with room for a loaded machine).
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(400) + absl::Seconds(2));
  ASSERT_EQ(answers.size(), 6u);
  ASSERT_TRUE(answers[0].ok()) << answers[0].status();
  EXPECT_EQ(answers[0]->version(), 1u);
  EXPECT_EQ(answers[0]->session_id(), (*one)->session_id());
  EXPECT_EQ(answers[1].status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(answers[1].status().message().find(squatted), std::string::npos);
  EXPECT_EQ(answers[2].status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(answers[3].ok()) << answers[3].status();
  EXPECT_EQ(answers[3]->version(), 2u);
  EXPECT_EQ(answers[4].status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(answers[5].ok()) << answers[5].status();
}

TEST(FetchDescriptorsTest, NoTargetsIsNoAnswers) {
  EXPECT_TRUE(FetchDescriptors({}, absl::Seconds(1)).empty());
}

TEST(DescriptorCacheTest, FetchesOncePerSessionAndAgainOnRefreshOrInvalidate) {
  uint64_t version = 1;
  int calls = 0;
  DescriptorCache cache(absl::Seconds(1), [&](absl::string_view) {
    ++calls;
    return absl::StatusOr<v1::HandshakeDescriptor>(Descriptor(version));
  });
  for (int i = 0; i < 3; ++i) {
    auto d = cache.Get("10.0.0.1:1");
    ASSERT_TRUE(d.ok());
    EXPECT_EQ((*d)->version(), 1u);
  }
  EXPECT_EQ(calls, 1);
  bool changed = true;
  ASSERT_TRUE(cache.Refresh("10.0.0.1:1", &changed).ok());
  EXPECT_FALSE(changed);
  version = 2;
  auto refreshed = cache.Refresh("10.0.0.1:1", &changed);
  ASSERT_TRUE(refreshed.ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ((*refreshed)->version(), 2u);
  EXPECT_EQ((*cache.Get("10.0.0.1:1"))->version(), 2u);
  cache.Invalidate("10.0.0.1:1");
  ASSERT_TRUE(cache.Get("10.0.0.1:1").ok());
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(cache.fetches(), 4u);
}

TEST(DescriptorCacheTest, AFailedFetchIsNotCached) {
  bool up = false;
  DescriptorCache cache(absl::Seconds(1),
                        [&](absl::string_view) -> absl::StatusOr<v1::HandshakeDescriptor> {
                          if (!up) return absl::DeadlineExceededError("down");
                          return Descriptor(7);
                        });
  EXPECT_FALSE(cache.Get("10.0.0.1:1").ok());
  up = true;
  auto d = cache.Get("10.0.0.1:1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->version(), 7u);
}

TEST(DescriptorCacheTest, DefaultFetcherTalksToARealServer) {
  auto server = HandshakeServer::Start("127.0.0.1", 0, [] { return Descriptor(9); });
  ASSERT_TRUE(server.ok());
  DescriptorCache cache;
  auto d = cache.Get((*server)->session_id());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->version(), 9u);
}

}  // namespace
// --- CURVE (docs/SECURITY.md, "Authentication (CURVE)") ------------------------------------

zmq_auth::KeyFile CurveKey(zmq_auth::KeyRole role, int rank) {
  absl::StatusOr<zmq_auth::KeyFile> key = zmq_auth::GenerateKeyFile({role, rank, ""});
  EXPECT_TRUE(key.ok()) << key.status();
  return *key;
}

TEST(HandshakeCurveTest, OnlyAnAllowedClientOfTheRightServerKeyGetsTheDescriptor) {
  const zmq_auth::KeyFile decode = CurveKey(zmq_auth::KeyRole::kDecode, 0);
  const zmq_auth::KeyFile prefill = CurveKey(zmq_auth::KeyRole::kPrefill, 1);
  zmq_auth::CurveServerKeys curve{decode, {}};
  curve.zap.allowed =
      std::make_shared<const zmq_auth::AllowedKeys>(*zmq_auth::AllowedKeys::FromKeys({prefill}));
  auto server = HandshakeServer::Start(
      "127.0.0.1", 0, [] { return Descriptor(7); }, "", curve);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string session = (*server)->session_id();

  const zmq_auth::CurveClientKeys allowed{prefill, decode.public_key};
  auto fetched = FetchDescriptor(session, absl::Seconds(5), &allowed);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->version(), 7u);

  // Not listed, a server key that is not the server's, no CURVE at all: no answer.
  const zmq_auth::CurveClientKeys stranger{CurveKey(zmq_auth::KeyRole::kPrefill, 1),
                                           decode.public_key};
  EXPECT_EQ(FetchDescriptor(session, absl::Milliseconds(500), &stranger).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const zmq_auth::CurveClientKeys wrong_server{prefill, prefill.public_key};
  EXPECT_EQ(FetchDescriptor(session, absl::Milliseconds(500), &wrong_server).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(FetchDescriptor(session, absl::Milliseconds(500)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*server)->requests_served(), 1u);
}

}  // namespace kvrail::transport
