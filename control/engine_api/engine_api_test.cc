#include "control/engine_api/engine_api.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"

namespace kvrail::engine_api {
namespace {

v1::EngineReply Echo(const v1::EngineRequest& request) {
  v1::EngineReply reply;
  if (request.has_poll()) {
    for (uint64_t room : request.poll().rooms()) {
      auto* state = reply.add_states();
      state->set_room(room);
      state->set_status(v1::TRANSFER_POLL_BOOTSTRAPPING);
    }
  }
  if (request.has_abort() && request.abort().room() == 0) reply.set_error("Abort room 0: unknown");
  return reply;
}

TEST(EngineApiTest, RequestsGetTheirRepliesAndEventsStreamToAttachedEngines) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = EngineApiClient::Connect((*server)->endpoint());
  ASSERT_TRUE(client.ok()) << client.status();
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(7);
  poll.mutable_poll()->add_rooms(9);
  auto reply = (*client)->Call(poll);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->states_size(), 2);
  EXPECT_EQ(reply->states(1).room(), 9u);

  v1::RoomEvent event;
  event.set_room(7);
  event.set_status(v1::TRANSFER_POLL_SUCCESS);
  event.set_bootstrap_token(42);
  (*server)->Publish(event);
  auto got = (*client)->NextEvent(absl::Seconds(5));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->room(), 7u);
  EXPECT_EQ(got->bootstrap_token(), 42);
}

TEST(EngineApiTest, HandlerErrorsComeBackAsFailedPrecondition) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok());
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(0);
  auto reply = client->Call(abort);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(reply.status().message().find("Abort room 0"), std::string::npos);
}

TEST(EngineApiTest, GarbageAndEmptyRequestsAreAnsweredWithAReasonAndServingGoesOn) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok());
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect((*server)->endpoint());
  dealer.send(zmq::str_buffer("\xff\xff\xff not a protobuf"), zmq::send_flags::none);
  zmq::message_t answer;
  ASSERT_TRUE(dealer.recv(answer));
  v1::SidecarMessage message;
  ASSERT_TRUE(message.ParseFromArray(answer.data(), static_cast<int>(answer.size())));
  EXPECT_NE(message.reply().error().find("EngineRequest"), std::string::npos);
  v1::EngineRequest empty;
  empty.set_request_id(5);
  dealer.send(zmq::buffer(empty.SerializeAsString()), zmq::send_flags::none);
  ASSERT_TRUE(dealer.recv(answer));
  ASSERT_TRUE(message.ParseFromArray(answer.data(), static_cast<int>(answer.size())));
  EXPECT_EQ(message.reply().request_id(), 5u);
  EXPECT_NE(message.reply().error().find("names no operation"), std::string::npos);
  EXPECT_EQ((*server)->malformed(), 2u);
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  v1::EngineRequest poll;
  poll.mutable_poll();
  EXPECT_TRUE(client->Call(poll).ok());
}

TEST(EngineApiTest, PipelinedSendsGetEveryReplyInOrderThroughNextMessage) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok());
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  std::vector<uint64_t> ids;
  for (uint64_t room = 1; room <= 50; ++room) {
    v1::EngineRequest poll;
    poll.mutable_poll()->add_rooms(room);
    absl::StatusOr<uint64_t> id = client->Send(poll);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  EXPECT_EQ(client->pending_replies(), 50u);
  for (uint64_t room = 1; room <= 50; ++room) {
    auto message = client->NextMessage(absl::Seconds(5));
    ASSERT_TRUE(message.ok()) << message.status();
    ASSERT_TRUE(message->has_value());
    ASSERT_TRUE((*message)->has_reply());
    EXPECT_EQ((*message)->reply().request_id(), ids[room - 1]);
    ASSERT_EQ((*message)->reply().states_size(), 1);
    EXPECT_EQ((*message)->reply().states(0).room(), room);
  }
  EXPECT_EQ(client->pending_replies(), 0u);
  auto none = client->NextMessage(absl::ZeroDuration());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(EngineApiTest, ASendsErrorComesBackInItsReply) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok());
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(0);
  ASSERT_TRUE(client->Send(abort).ok());
  auto message = client->NextMessage(absl::Seconds(5));
  ASSERT_TRUE(message.ok() && message->has_value());
  EXPECT_NE((*message)->reply().error().find("Abort room 0"), std::string::npos);
}

TEST(EngineApiTest, CallAndNextEventKeepSendRepliesAndEventsForNextMessage) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok());
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(3);
  const uint64_t sent = client->Send(poll).value();
  ASSERT_TRUE(client->Call(poll).ok());  // registers the engine; the Send's reply comes first
  v1::RoomEvent event;
  event.set_room(11);
  event.set_status(v1::TRANSFER_POLL_SUCCESS);
  (*server)->Publish(event);
  // NextEvent takes the event and leaves the Send's reply.
  std::optional<v1::RoomEvent> got = client->NextEvent(absl::Seconds(5));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->room(), 11u);
  auto reply = client->NextMessage(absl::Seconds(5));
  ASSERT_TRUE(reply.ok() && reply->has_value());
  ASSERT_TRUE((*reply)->has_reply());
  EXPECT_EQ((*reply)->reply().request_id(), sent);
  // Events and replies interleave in arrival order.
  ASSERT_TRUE(client->Send(poll).ok());
  (*server)->Publish(event);
  int replies = 0;
  int events = 0;
  while (replies + events < 2) {
    auto message = client->NextMessage(absl::Seconds(5));
    ASSERT_TRUE(message.ok() && message->has_value());
    ((*message)->has_reply() ? replies : events) += 1;
  }
  EXPECT_EQ(replies, 1);
  EXPECT_EQ(events, 1);
  EXPECT_EQ(client->pending_replies(), 0u);
}

TEST(EngineApiTest, ASubMillisecondWaitReturnsEmptyAndLaterMessagesStillArrive) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok());
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  auto none = client->NextMessage(absl::Microseconds(300));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(1);
  const uint64_t id = client->Send(poll).value();
  std::optional<v1::SidecarMessage> got;
  for (int i = 0; i < 100000 && !got.has_value(); ++i) {
    got = client->NextMessage(absl::Microseconds(100)).value();
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->reply().request_id(), id);
}

TEST(EngineApiTest, NoSidecarIsDeadlineExceeded) {
  auto client = EngineApiClient::Connect("tcp://127.0.0.1:1").value();
  v1::EngineRequest poll;
  poll.mutable_poll();
  auto reply = client->Call(poll, absl::Milliseconds(200));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// A deferred request (a large manifest, in the sidecar) is answered later from another thread,
// while the server answers other engines' requests meanwhile; the late answer carries its
// request_id, and one after Stop is dropped.
TEST(EngineApiTest, DeferredRequestsLetOthersBeAnswered) {
  std::mutex mu;
  std::condition_variable changed;
  std::vector<EngineApiServer::Responder> taken;
  auto server = EngineApiServer::Start(
      "tcp://127.0.0.1:0", Echo,
      [&](const v1::EngineRequest& request, const EngineApiServer::Responder& respond) {
        if (!request.has_abort() || request.abort().room() != 99) return false;
        std::lock_guard<std::mutex> lock(mu);
        taken.push_back(respond);
        changed.notify_all();
        return true;
      });
  ASSERT_TRUE(server.ok()) << server.status();
  auto slow = EngineApiClient::Connect((*server)->endpoint()).value();
  auto other = EngineApiClient::Connect((*server)->endpoint()).value();
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(99);
  const uint64_t id = slow->Send(abort).value();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(changed.wait_for(lock, std::chrono::seconds(10), [&] { return !taken.empty(); }));
  }
  // The deferred request is unanswered; another client's Stats is answered meanwhile.
  v1::EngineRequest stats;
  stats.mutable_stats();
  ASSERT_TRUE(other->Call(stats).ok());
  auto none = slow->NextMessage(absl::Milliseconds(50));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  // The copy is taken under the lock: the server thread appends to `taken` under it, and what
  // orders that append after this answer (the next Send) goes through ZeroMQ, which TSan does
  // not see.
  EngineApiServer::Responder first = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return taken[0];
  }();
  std::thread answer([first] {
    v1::EngineReply reply;
    reply.set_error("Abort room 99: answered late");
    first(reply);
    first(v1::EngineReply());  // a second answer is ignored
  });
  answer.join();
  std::optional<v1::SidecarMessage> got = slow->NextMessage(absl::Seconds(5)).value();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->reply().request_id(), id);
  EXPECT_EQ(got->reply().error(), "Abort room 99: answered late");
  auto second = slow->NextMessage(absl::Milliseconds(50));
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->has_value());

  ASSERT_TRUE(slow->Send(abort).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(
        changed.wait_for(lock, std::chrono::seconds(10), [&] { return taken.size() == 2; }));
  }
  (*server)->Stop();
  server->reset();
  taken[1](v1::EngineReply());  // after Stop and destruction: dropped, harmlessly
}

// One engine per sidecar (the issue: a second engine got every room event and could abort
// rooms). A second identity is refused, but for Stats; while the first is connected, its
// AttachArena is refused too unless it carries the engine token of the first's attach reply;
// with it (a restarted engine that kept its token), it becomes the engine, and events go to it
// alone.
TEST(EngineApiTest, ASecondEngineIsRefusedUnlessItPresentsTheFirstsToken) {
  auto handler = [](const v1::EngineRequest& request) {
    v1::EngineReply reply;
    if (request.has_attach() && request.attach().shm_name() != "/arena") {
      reply.set_error("AttachArena: not this sidecar's arena");
    }
    return reply;
  };
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", handler).value();
  auto first = EngineApiClient::Connect(server->endpoint()).value();
  auto second = EngineApiClient::Connect(server->endpoint()).value();
  v1::EngineRequest attach;
  attach.mutable_attach()->set_shm_name("/arena");
  absl::StatusOr<v1::EngineReply> attached = first->Call(attach);
  ASSERT_TRUE(attached.ok()) << attached.status();
  const std::string token = attached->engine_token();
  EXPECT_EQ(token.size(), 32u);
  EXPECT_EQ(first->Call(attach)->engine_token(), token);  // the engine itself needs none
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(5);
  ASSERT_TRUE(first->Call(abort).ok());
  absl::StatusOr<v1::EngineReply> refused = second->Call(abort);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("another engine drives this sidecar"),
            std::string::npos)
      << refused.status();
  v1::EngineRequest stats;
  stats.mutable_stats();
  EXPECT_TRUE(second->Call(stats).ok());
  refused = second->Call(attach);  // the right arena, but no token
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("only with the engine token"), std::string::npos)
      << refused.status();
  attach.mutable_attach()->set_engine_token(std::string(32, '0'));
  EXPECT_FALSE(second->Call(attach).ok());  // a wrong one
  EXPECT_FALSE(second->Call(abort).ok());   // a refused attach takes nothing over
  EXPECT_EQ(server->refused(), 4u);

  v1::RoomEvent event;
  event.set_room(1);
  server->Publish(event);
  EXPECT_TRUE(first->NextEvent(absl::Seconds(5)).has_value());
  EXPECT_FALSE(second->NextEvent(absl::Milliseconds(200)).has_value());

  attach.mutable_attach()->set_engine_token(token);
  ASSERT_TRUE(second->Call(attach).ok());
  EXPECT_TRUE(second->Call(abort).ok());
  EXPECT_FALSE(first->Call(abort).ok());
  event.set_room(2);
  server->Publish(event);
  EXPECT_TRUE(second->NextEvent(absl::Seconds(5)).has_value());
  EXPECT_FALSE(first->NextEvent(absl::Milliseconds(200)).has_value());
  EXPECT_EQ(server->engines(), 1u);
}

// An engine that died without its token: once its connection is gone, a new client's
// AttachArena takes over without one.
TEST(EngineApiTest, OnceTheEnginesConnectionIsGoneAnAttachNeedsNoToken) {
  auto handler = [](const v1::EngineRequest&) { return v1::EngineReply(); };
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", handler).value();
  v1::EngineRequest attach;
  attach.mutable_attach()->set_shm_name("/arena");
  {
    auto dead = EngineApiClient::Connect(server->endpoint()).value();
    ASSERT_TRUE(dead->Call(attach).ok());
  }  // its socket closes
  auto restarted = EngineApiClient::Connect(server->endpoint()).value();
  absl::StatusOr<v1::EngineReply> taken = restarted->Call(attach);
  for (int attempt = 0; attempt < 100 && !taken.ok(); ++attempt) {
    absl::SleepFor(absl::Milliseconds(50));  // until the server sees the old connection closed
    taken = restarted->Call(attach);
  }
  ASSERT_TRUE(taken.ok()) << taken.status();
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(5);
  EXPECT_TRUE(restarted->Call(abort).ok());
}

TEST(EngineApiTest, AnIpcSocketIsItsOwnersAlone) {
  // /tmp: a unix socket path has at most 107 bytes, which the test's own directory passes. A
  // directory of its own: sandboxed runs share /tmp and may share a pid (each its own namespace).
  char dir[] = "/tmp/kvrail-engine-api-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = absl::StrCat(dir, "/engine.sock");
  auto server = EngineApiServer::Start(absl::StrCat("ipc://", path), Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  server->reset();
  EXPECT_NE(stat(path.c_str(), &st), 0) << path << " outlived its server";
  EXPECT_EQ(rmdir(dir), 0) << dir << " is not empty";
}

TEST(EngineApiTest, AServerRemovesItsSocketFileButNotOneThatReplacedIt) {
  char dir[] = "/tmp/kvrail-engine-api-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string endpoint = absl::StrCat("ipc://", dir, "/engine.sock");
  auto first = EngineApiServer::Start(endpoint, Echo);
  ASSERT_TRUE(first.ok()) << first.status();
  // A second server on the same path (a sidecar restarted before the first one exited): its
  // bind replaces the file, and the first server's Stop must leave the second's alone.
  auto second = EngineApiServer::Start(endpoint, Echo);
  ASSERT_TRUE(second.ok()) << second.status();
  first->reset();
  const std::string path = endpoint.substr(6);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0) << "the second server's socket file was removed";
  auto client = EngineApiClient::Connect(endpoint).value();
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(7);
  EXPECT_TRUE(client->Call(poll).ok());
  client.reset();
  second->reset();
  EXPECT_NE(stat(path.c_str(), &st), 0) << path << " outlived its server";
  EXPECT_EQ(rmdir(dir), 0) << dir << " is not empty";
}

TEST(EngineApiTest, BindFailureNamesTheEndpoint) {
  auto server = EngineApiServer::Start("tcp://256.0.0.1:0", Echo);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("256.0.0.1"), std::string::npos);
}

// --- CURVE on tcp (docs/SECURITY.md, "Authentication (CURVE)") ----------------------------

TEST(EngineApiCurveTest, OnlyTheEngineKeyOfTheSidecarsRankIsServed) {
  auto key = [](zmq_auth::KeyRole role, int rank) {
    return *zmq_auth::GenerateKeyFile({role, rank, ""});
  };
  const zmq_auth::KeyFile sidecar = key(zmq_auth::KeyRole::kPrefill, 2);
  const zmq_auth::KeyFile engine = key(zmq_auth::KeyRole::kEngine, 2);
  const zmq_auth::KeyFile other_engine = key(zmq_auth::KeyRole::kEngine, 1);
  zmq_auth::CurveServerKeys curve{sidecar, {}};
  curve.zap.allowed = std::make_shared<const zmq_auth::AllowedKeys>(
      *zmq_auth::AllowedKeys::FromKeys({engine, other_engine}));
  curve.zap.admit = [](const zmq_auth::KeyIdentity& identity) {
    return identity.role == zmq_auth::KeyRole::kEngine && identity.rank == 2
               ? absl::OkStatus()
               : absl::PermissionDeniedError("not the engine of rank 2");
  };
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo, nullptr, curve);
  ASSERT_TRUE(server.ok()) << server.status();
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(7);

  const zmq_auth::CurveClientKeys mine{engine, sidecar.public_key};
  auto client = EngineApiClient::Connect((*server)->endpoint(), &mine);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Call(poll).ok());

  const zmq_auth::CurveClientKeys another_rank{other_engine, sidecar.public_key};
  auto refused = EngineApiClient::Connect((*server)->endpoint(), &another_rank);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ((*refused)->Call(poll, absl::Milliseconds(500)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  auto plain = EngineApiClient::Connect((*server)->endpoint());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->Call(poll, absl::Milliseconds(500)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// Liveness: the client sees its sidecar's connection close, fails the rooms begun through it
// that had not ended (pages held: this server's pid is unknown to it), and says why.
TEST(EngineApiTest, ALostSidecarFailsTheRoomsBegunHereAndCallsSayWhy) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = EngineApiClient::Connect((*server)->endpoint()).value();
  v1::EngineRequest expect;
  expect.mutable_expect()->set_room(5);
  ASSERT_TRUE(client->Call(expect).ok());
  v1::EngineRequest begin;
  begin.mutable_begin()->set_room(6);
  ASSERT_TRUE(client->Call(begin).ok());
  v1::RoomEvent landed;
  landed.set_room(6);
  landed.set_status(v1::TRANSFER_POLL_SUCCESS);
  (*server)->Publish(landed);
  std::optional<v1::RoomEvent> first = client->NextEvent(absl::Seconds(5));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->room(), 6u);  // ended: not the client's to report any more
  EXPECT_FALSE(client->lost().has_value());

  server->reset();  // the sidecar goes away: its connection closes
  std::optional<v1::RoomEvent> failed = client->NextEvent(absl::Seconds(10));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->room(), 5u);
  EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
  EXPECT_EQ(failed->pages(), v1::PAGES_HELD);
  EXPECT_NE(failed->reason().find("the sidecar is lost"), std::string::npos) << failed->reason();
  EXPECT_FALSE(client->NextEvent(absl::Milliseconds(200)).has_value());
  ASSERT_TRUE(client->lost().has_value());
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(5);
  const absl::Status refused = client->Call(poll, absl::Seconds(1)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(refused.message().find("the sidecar is lost"), absl::string_view::npos) << refused;
}

// The client told the engine Failed (pages held) when the connection was lost; the same sidecar
// comes back and ends the room itself. That is not a second terminal event: the engine gets the
// release of the room's pages, once, and nothing more of the room (issue 29: an engine freed
// pages twice on a repeated Failed).
TEST(EngineApiTest, ARoomFailedWhileTheSidecarWasLostEndsOnceAndItsOutcomeOnlyReleasesIt) {
  auto server = EngineApiServer::Start("tcp://127.0.0.1:0", Echo);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string endpoint = (*server)->endpoint();
  auto client = EngineApiClient::Connect(endpoint).value();
  for (uint64_t room : {5, 7}) {
    v1::EngineRequest expect;
    expect.mutable_expect()->set_room(room);
    ASSERT_TRUE(client->Call(expect).ok());
  }
  server->reset();  // lost: this server's pid is unknown to the client, so pages are held
  for (uint64_t room : {5, 7}) {
    std::optional<v1::RoomEvent> failed = client->NextEvent(absl::Seconds(10));
    ASSERT_TRUE(failed.has_value());
    EXPECT_EQ(failed->room(), room);
    EXPECT_EQ(failed->status(), v1::TRANSFER_POLL_FAILED);
    EXPECT_EQ(failed->pages(), v1::PAGES_HELD);
  }

  auto back = EngineApiServer::Start(endpoint, Echo);  // the same sidecar, reachable again
  ASSERT_TRUE(back.ok()) << back.status();
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(5);
  ASSERT_TRUE(client->Call(poll, absl::Seconds(10)).ok());  // waits for the reconnection
  v1::RoomEvent gave_up;  // the sidecar's own end of room 5: pages reusable
  gave_up.set_room(5);
  gave_up.set_status(v1::TRANSFER_POLL_FAILED);
  gave_up.set_pages(v1::PAGES_REUSABLE);
  gave_up.set_reason("Decode session 10.0.0.2:1 gave the room up (kvrail fence request)");
  (*back)->Publish(gave_up);
  v1::RoomEvent held = gave_up;  // room 7's: held, then released by the sidecar
  held.set_room(7);
  held.set_pages(v1::PAGES_HELD);
  (*back)->Publish(held);
  v1::RoomEvent released;
  released.set_room(7);
  released.set_status(v1::TRANSFER_POLL_PAGES_RELEASED);
  released.set_pages(v1::PAGES_REUSABLE);
  released.set_pages_released(true);
  released.set_pages_proven(true);
  (*back)->Publish(released);

  std::optional<v1::RoomEvent> first = client->NextEvent(absl::Seconds(10));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->room(), 5u);
  EXPECT_EQ(first->status(), v1::TRANSFER_POLL_PAGES_RELEASED);
  EXPECT_TRUE(first->pages_released());
  EXPECT_TRUE(first->pages_proven());
  EXPECT_NE(first->reason().find("gave the room up"), std::string::npos) << first->reason();
  std::optional<v1::RoomEvent> second = client->NextEvent(absl::Seconds(10));
  ASSERT_TRUE(second.has_value());  // room 7's Failed (held) was dropped: told already
  EXPECT_EQ(second->room(), 7u);
  EXPECT_EQ(second->status(), v1::TRANSFER_POLL_PAGES_RELEASED);
  EXPECT_TRUE(second->pages_released());
  EXPECT_FALSE(client->NextEvent(absl::Milliseconds(300)).has_value());
}

}  // namespace
}  // namespace kvrail::engine_api
