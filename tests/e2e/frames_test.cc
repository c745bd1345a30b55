// The CachePD frames real sidecar processes emit, read by a fake peer with kvrail's strict
// parsers (the vectors' rules, CACHEPD §3): a fake prefill rank facing a decode sidecar, and
// a fake decode rank (with a real UCX data plane) facing a prefill sidecar.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "cluster/process/subprocess.h"
#include "control/bootstrap/client.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/wire/dispatch.h"
#include "control/wire/preallocation.h"
#include "control/wire/proof.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"
#include "engine/memory/arena.h"
#include "engine/memory/pattern.h"
#include "engine/transport/factory.h"
#include "engine/transport/handshake/handshake.h"
#include "tests/e2e/sidecar_peer.h"

namespace kvrail {
namespace {

using process::Subprocess;

using e2e::Receive;
using e2e::RoomManifest;
using e2e::SmallContract;

// Attaches `arena_name` with `contract` through the engine API, as an engine does.
void Attach(engine_api::EngineApiClient& engine, const std::string& arena_name,
            const layout::Contract& contract) {
  v1::EngineRequest attach;
  attach.mutable_attach()->set_shm_name(arena_name);
  attach.mutable_attach()->set_contract(layout::SerializeContract(contract).value());
  auto reply = engine.Call(attach);
  ASSERT_TRUE(reply.ok()) << reply.status();
}

using e2e::Bootstrap;

TEST(SidecarFramesTest, ADecodeSidecarsRegistrationAndPreallocationParseStrictly) {
  Bootstrap bootstrap;
  const layout::Contract contract = SmallContract();
  // The fake prefill rank: a PULL socket, registered with the bootstrap server.
  zmq::context_t context;
  zmq::socket_t pull(context, zmq::socket_type::pull);
  ASSERT_TRUE(e2e::RegisterFakePrefillRank(bootstrap, pull, contract));
  // The real decode sidecar, driven through its engine API.
  const std::string api =
      absl::StrCat("ipc:///tmp/kvrail-frames-", process::ProcessTag(), "-d.sock");
  // The fake prefill stands in for tokenspeed's, which proves nothing; it registers with
  // kvrail's bootstrap server, which says its node is kvrail's: so proofs are off here, as for
  // any node mixing tokenspeed prefill ranks into a kvrail bootstrap (docs/SECURITY.md).
  auto sidecar =
      Subprocess::Start({testing::KvrailBinary(), "sidecar", "--role", "decode",
                         "--engine-endpoint", api, "--tls", "tcp", "--sender-proofs", "off"});
  ASSERT_TRUE(sidecar.ok());
  ASSERT_TRUE((*sidecar)->ReadUntil("sidecar ready", absl::Seconds(30)).ok());
  const std::string arena_name = absl::StrCat("/kvrail-frames-", process::ProcessTag(), "-d");
  Arena arena = Arena::CreateShared(arena_name, contract.ArenaBytes()).value();
  auto engine = engine_api::EngineApiClient::Connect(api).value();
  Attach(*engine, arena_name, contract);
  const layout::Manifest manifest = RoomManifest(contract, {3, 4, 5});
  v1::EngineRequest expect;
  expect.mutable_expect()->set_room(5);
  expect.mutable_expect()->set_bootstrap_address(bootstrap.address);
  expect.mutable_expect()->set_destination_manifest(layout::SerializeManifest(manifest).value());
  ASSERT_TRUE(engine->Call(expect).ok());

  // CACHEPD §3.2: 8 frames, strictly valid, with the canonical contract.
  const std::vector<std::string> reg_frames = Receive(pull);
  auto parsed = wire::ParseRegistration(reg_frames, [](absl::string_view wire) {
    auto c = layout::ParseContract(wire);
    return c.ok() ? layout::ValidateContract(*c) : c.status();
  });
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->contract_wire, layout::SerializeContract(contract).value());
  EXPECT_NE(parsed->arena_base, 0u);
  EXPECT_EQ(parsed->decode_tp_size, 1u);
  // kvrail's owner proof comes first (control/wire/proof.h): not a CachePD message, so a
  // tokenspeed prefill drops it (§3.2.1).
  const std::vector<std::string> proof_frames = Receive(pull);
  EXPECT_EQ(wire::Classify(proof_frames), wire::MessageKind::kDropped);
  auto proof = wire::ParseOwnerProof(proof_frames);
  ASSERT_TRUE(proof.ok()) << proof.status();
  EXPECT_EQ(proof->room, 5u);
  // CACHEPD §3.3: 3 frames, the room, the session and the canonical manifest.
  const std::vector<std::string> pre_frames = Receive(pull);
  auto pre = wire::ParsePreallocation(pre_frames);
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ(pre->room, 5u);
  EXPECT_EQ(pre->session_id, parsed->session_id);
  EXPECT_EQ(pre->manifest_wire, layout::SerializeManifest(manifest).value());

  // Answer as a 2026-09 prefill would (CACHEPD §12.9): Success with a token, speculative ids,
  // its cached-token count and the token's logprob, in 7 frames.
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 2000);
  push.connect(absl::StrCat("tcp://", parsed->endpoint, ":", parsed->port));
  wire::StatusMessage status;
  status.room = 5;
  status.status = 5;
  status.prefill_rank = 0;
  status.bootstrap_token = 77;
  status.spec_candidate_ids = std::vector<int32_t>{1, 2};
  status.cached_tokens = 128;
  status.bootstrap_logprob = -0.25;
  std::vector<zmq::const_buffer> frames;
  const std::vector<std::string> status_frames =
      wire::BuildStatus(status, wire::StatusForm::k2026_09).value();
  for (const std::string& f : status_frames) frames.push_back(zmq::buffer(f));
  ASSERT_TRUE(zmq::send_multipart(push, frames));
  std::optional<v1::RoomEvent> event = engine->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->room(), 5u);
  EXPECT_EQ(event->status(), v1::TRANSFER_POLL_SUCCESS) << event->reason();
  EXPECT_EQ(event->bootstrap_token(), 77);
  ASSERT_EQ(event->speculative_ids_size(), 2);
  EXPECT_EQ(event->speculative_ids(1), 2);
  EXPECT_EQ(event->cached_tokens(), 128);
  ASSERT_TRUE(event->has_first_token_logprob());
  EXPECT_EQ(event->first_token_logprob(), -0.25);
  // Polling says the same (RoomState).
  v1::EngineRequest poll;
  poll.mutable_poll()->add_rooms(5);
  absl::StatusOr<v1::EngineReply> polled = engine->Call(poll);
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_EQ(polled->states_size(), 1);
  EXPECT_EQ(polled->states(0).cached_tokens(), 128);
  EXPECT_EQ(polled->states(0).first_token_logprob(), -0.25);
  (*sidecar)->Signal(SIGTERM);
  EXPECT_EQ((*sidecar)->Wait(absl::Seconds(10)).value_or(-1), 0);
}

TEST(SidecarFramesTest, APrefillSidecarWritesTheRoomThenSendsAStrictSuccessStatus) {
  Bootstrap bootstrap;
  const layout::Contract contract = SmallContract();
  // The real prefill sidecar and its arena, patterned.
  const std::string api =
      absl::StrCat("ipc:///tmp/kvrail-frames-", process::ProcessTag(), "-p.sock");
  auto sidecar = Subprocess::Start({testing::KvrailBinary(), "sidecar", "--role", "prefill",
                                    "--engine-endpoint", api, "--bootstrap", bootstrap.address,
                                    "--tls", "tcp"});
  ASSERT_TRUE(sidecar.ok());
  absl::StatusOr<std::string> ready = (*sidecar)->ReadUntil("sidecar ready", absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready.status();
  const std::string cachepd = process::LineField(*ready, "cachepd");
  const std::string arena_name = absl::StrCat("/kvrail-frames-", process::ProcessTag(), "-p");
  Arena source = Arena::CreateShared(arena_name, contract.ArenaBytes()).value();
  FillPattern(absl::MakeSpan(source.data(), source.size()), 42);
  auto engine = engine_api::EngineApiClient::Connect(api).value();
  Attach(*engine, arena_name, contract);

  // The fake decode rank: a real UCX transport and handshake server, and a PULL socket.
  std::vector<uint8_t> destination(contract.ArenaBytes(), 0);
  transport::TransportSpec spec;
  spec.tls = "tcp";
  spec.net_devices = "lo";
  auto transport = transport::MakeTransport(spec).value();
  ASSERT_TRUE(transport->Register({destination.data(), destination.size()}).ok());
  zmq::context_t context;
  zmq::socket_t pull(context, zmq::socket_type::pull);
  pull.set(zmq::sockopt::rcvtimeo, 20000);
  pull.bind("tcp://127.0.0.1:0");
  const std::string pull_endpoint = pull.get(zmq::sockopt::last_endpoint);
  // The descriptor vouches for the registration below: this PULL socket is its endpoint.
  auto handshake = transport::HandshakeServer::Start("127.0.0.1", 0, [&] {
                     absl::StatusOr<v1::HandshakeDescriptor> d = transport->LocalDescriptor();
                     if (d.ok()) d->set_cachepd_endpoint(pull_endpoint);
                     return d;
                   }).value();
  wire::Registration registration;
  registration.endpoint = "127.0.0.1";
  registration.port =
      static_cast<uint16_t>(std::stoi(pull_endpoint.substr(pull_endpoint.rfind(':') + 1)));
  registration.session_id = handshake->session_id();
  registration.arena_base = reinterpret_cast<uintptr_t>(destination.data());
  registration.contract_wire = layout::SerializeContract(contract).value();
  registration.decode_tp_size = 1;
  registration.decode_tp_rank = 0;
  const layout::Manifest src = RoomManifest(contract, {1, 2, 3});
  const layout::Manifest dst = RoomManifest(contract, {7, 9, 11});
  wire::Preallocation preallocation;
  preallocation.room = 9;
  preallocation.session_id = handshake->session_id();
  preallocation.manifest_wire = layout::SerializeManifest(dst).value();
  zmq::socket_t push(context, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 2000);
  push.connect(cachepd);
  for (const auto& message : {wire::BuildRegistration(registration).value(),
                              wire::BuildPreallocation(preallocation).value()}) {
    std::vector<zmq::const_buffer> frames;
    for (const std::string& f : message) frames.push_back(zmq::buffer(f));
    ASSERT_TRUE(zmq::send_multipart(push, frames));
  }
  v1::EngineRequest ready_request;
  ready_request.mutable_ready()->set_room(9);
  ready_request.mutable_ready()->set_source_manifest(layout::SerializeManifest(src).value());
  ready_request.mutable_ready()->set_bootstrap_token(123);
  ready_request.mutable_ready()->add_speculative_ids(4);
  // More cached tokens than the prompt has: refused, naming the field, and nothing is stored.
  ready_request.mutable_ready()->set_cached_tokens(src.prompt_len + 1);
  absl::StatusOr<v1::EngineReply> refused = engine->Call(ready_request);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("cached_tokens"));
  ready_request.mutable_ready()->set_cached_tokens(src.prompt_len);
  ready_request.mutable_ready()->set_first_token_logprob(-0.5);
  ASSERT_TRUE(engine->Call(ready_request).ok());

  // CACHEPD §12.9: the registration's contract is in the 2026-09 form, so the status is 7
  // frames, strictly valid, sent only after the bytes landed, with the Ready's cached tokens
  // and logprob.
  const std::vector<std::string> status_frames = Receive(pull);
  auto status = wire::ParseStatus(status_frames);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status_frames.size(), 7u);
  EXPECT_EQ(status->cached_tokens, src.prompt_len);
  EXPECT_EQ(status->bootstrap_logprob, -0.5);
  EXPECT_EQ(status->room, 9u);
  EXPECT_EQ(status->status, 5);
  EXPECT_EQ(status->prefill_rank, 0u);
  EXPECT_EQ(status->bootstrap_token, 123);
  ASSERT_TRUE(status->spec_candidate_ids.has_value());
  EXPECT_EQ(*status->spec_candidate_ids, std::vector<int32_t>{4});
  // Every planned byte is there, every other byte untouched.
  const plan::CopyPlan copy_plan = plan::CopyPlan::Bind(contract, contract, {}).value();
  plan::CopyList copies;
  ASSERT_TRUE(copy_plan.Expand(src, dst, copies).ok());
  std::vector<uint8_t> expected(destination.size(), 0);
  for (const plan::Copy& c : copies) {
    std::memcpy(&expected[c.dst_offset], source.data() + c.src_offset, c.length);
  }
  EXPECT_TRUE(expected == destination);
  std::optional<v1::RoomEvent> event = engine->NextEvent(absl::Seconds(20));
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->status(), v1::TRANSFER_POLL_SUCCESS) << event->reason();
  EXPECT_GT(event->bytes(), 0u);
  (*sidecar)->Signal(SIGTERM);
  EXPECT_EQ((*sidecar)->Wait(absl::Seconds(10)).value_or(-1), 0);
  handshake->Stop();
  transport->Close();
}

}  // namespace
}  // namespace kvrail
