// Security on (docs/SECURITY.md, "Authentication (CURVE)"): a real deployment whose sidecars
// hold keys made by `kvrail keygen` and accept only the keys of one allowed directory. A room
// lands byte-exact; a peer without a key delivers nothing to either side; a peer whose key is
// allowed but of another role or rank cannot speak as what it is not.
#include "engine/zmq_auth/curve.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cluster/process/subprocess.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/zmq_auth/key_file.h"
#include "tests/chaos/deployment.h"

namespace kvrail::hostile {
namespace {

using chaos::Deployment;
using chaos::DeploymentOptions;

std::string TestDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

std::string OutputsDir() {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return dir != nullptr ? dir : "/tmp";
}

// `kvrail keygen` of one key into keys/; its .pub copied into allowed/ unless `allowed` is false.
void Keygen(const std::string& role, int rank, bool allowed = true) {
  const std::string keys = TestDir() + "/keys";
  const std::string command = absl::StrCat(
      "tools/kvrail keygen --role ", role, " --rank ", rank, " --out ", keys,
      allowed ? absl::StrCat(" && cp ", keys, "/", role, "-", rank, ".pub ", TestDir(), "/allowed/")
              : "");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

zmq_auth::KeyFile Key(const std::string& name) {
  absl::StatusOr<zmq_auth::KeyFile> key =
      zmq_auth::ReadSecretKeyFile(TestDir() + "/keys/" + name + ".key");
  EXPECT_TRUE(key.ok()) << key.status();
  return key.ok() ? *key : zmq_auth::KeyFile();
}

int CountLines(const std::string& rank, const std::string& text) {
  std::ifstream log(chaos::Deployment::LogPath(rank));
  std::string line;
  int count = 0;
  while (std::getline(log, line)) count += line.find(text) != std::string::npos ? 1 : 0;
  return count;
}

class CurveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(
        std::system(absl::StrCat("rm -rf ", TestDir(), "/keys ", TestDir(), "/allowed && mkdir -p ",
                                 TestDir(), "/allowed ", TestDir(), "/keys")
                        .c_str()),
        0);
    Keygen("prefill", 0);
    Keygen("prefill", 1);  // allowed, but not the rank that serves the decode
    Keygen("decode", 0);
    Keygen("decode", 3);
    Keygen("decode", 5, /*allowed=*/false);  // made, never listed
    Keygen("engine", 0);
    Keygen("engine", 1);
  }

  void SetUp() override {
    DeploymentOptions options;
    options.pages = 32;
    const std::string allowed = TestDir() + "/allowed";
    options.prefill_args = {"--curve-key", TestDir() + "/keys/prefill-0.key", "--curve-allowed",
                            allowed};
    options.decode_args = {"--curve-key", TestDir() + "/keys/decode-0.key", "--curve-allowed",
                           allowed};
    // Its warm-up room to each decode already went through every CURVE socket: the
    // registration, the handshake fetch, the pre-allocation, the data plane, the status.
    auto started = Deployment::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    d_ = *std::move(started);
  }

  // A PUSH socket to `endpoint`: a CURVE client with `key` of the server `server` (a key name),
  // or a plain one when `key` is empty.
  zmq::socket_t Push(const std::string& endpoint, const std::string& key,
                     const std::string& server) {
    zmq::socket_t push(context_, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, 0);
    // A peer whose handshake the server refuses may have no connection to queue on: ZeroMQ
    // tears it down and reconnects, and a blocking send would wait for ever.
    push.set(zmq::sockopt::sndtimeo, 2000);
    if (!key.empty()) {
      const absl::Status made =
          zmq_auth::MakeCurveClient(push.handle(), Key(key), Key(server).public_key);
      EXPECT_TRUE(made.ok()) << made;
    }
    push.connect(endpoint);
    return push;
  }

  // Queues `frames` when the socket has a connection to queue on within 2 s. Whether a refused
  // peer's send is queued is ZeroMQ's race; either way nothing may reach the sidecar.
  static void Send(zmq::socket_t& push, const std::vector<std::string>& frames) {
    std::vector<zmq::const_buffer> parts;
    for (const std::string& f : frames) parts.push_back(zmq::buffer(f));
    (void)zmq::send_multipart(push, parts);
  }

  // A forged Success for `room` claiming prefill rank `rank`, sent by `key` (or a plain peer)
  // to the decode, which waits for that room: no event comes until the real one, which lands.
  void ExpectForgedSuccessIgnored(uint64_t room, const std::string& key, int rank) {
    const layout::Manifest manifest = d_->Blocks(1, 4);
    ASSERT_TRUE(d_->Expect(0, room, manifest).ok());
    absl::SleepFor(absl::Milliseconds(200));
    zmq::socket_t push = Push(d_->decode(0).cachepd_endpoint, key, "decode-0");
    Send(push, wire::BuildStatus({room, 5, static_cast<uint32_t>(rank), 7, std::nullopt},
                                 wire::StatusForm::kSnapshot)
                   .value());
    absl::StatusOr<v1::RoomEvent> early = d_->Event(d_->decode(0), room, absl::Seconds(1));
    EXPECT_FALSE(early.ok()) << "the decode published " << early->DebugString();
    ASSERT_TRUE(d_->Ready(room, manifest).ok());
    absl::StatusOr<v1::RoomEvent> done = d_->Event(d_->decode(0), room, absl::Seconds(30));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
    EXPECT_TRUE(d_->Landed(0, manifest));
  }

  std::unique_ptr<Deployment> d_;
  zmq::context_t context_;
};

TEST_F(CurveTest, ARoomLandsByteExactWithSecurityOn) {
  const absl::Status moved = d_->MoveRoom(0, 11, d_->Blocks(1, 16));
  EXPECT_TRUE(moved.ok()) << moved;
  EXPECT_EQ(CountLines("prefill", "event=curve_refused"), 0);
  EXPECT_EQ(CountLines("decode0", "event=curve_refused"), 0);
}

// A plain ZeroMQ peer (no key) sends a forged Success to the decode and a registration and
// pre-allocation to the prefill: it never finishes a handshake, so nothing reaches either
// sidecar; the decode's real room lands.
TEST_F(CurveTest, APeerWithoutAKeyDeliversNothing) {
  zmq::socket_t to_prefill = Push(d_->prefill().cachepd_endpoint, "", "");
  wire::Registration forged;
  forged.endpoint = "127.0.0.1";
  forged.port = 1;
  forged.session_id = d_->decode(0).session_id;
  forged.arena_base = 4096;
  forged.contract_wire = layout::SerializeContract(d_->contract()).value();
  forged.decode_tp_size = 1;
  forged.decode_tp_rank = 0;
  Send(to_prefill, wire::BuildRegistration(forged).value());
  const uint64_t rejected_before = d_->Stats(d_->prefill())->peer_messages_rejected();
  ExpectForgedSuccessIgnored(21, "", 0);
  const absl::StatusOr<v1::SidecarStats> stats = d_->Stats(d_->prefill());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->registrations(), 1u);  // the real decode's alone
  EXPECT_GE(stats->peer_messages_rejected(), rejected_before);
  // (Whether the sidecars log the plain peer's failed handshakes depends on a race in ZeroMQ:
  // it reports the protocol error only when it sees the mismatch before the peer hangs up.
  // docs/SECURITY.md, "Authentication (CURVE)".)
}

// Keys that are allowed, but not for what they claim: a decode's key speaking to a decode (its
// CachePD socket hears prefill keys only), a prefill key of rank 1 claiming rank 0, and a key
// nobody listed. None of their Successes is taken; each refusal is logged.
TEST_F(CurveTest, AnAllowedKeyCannotSpeakAsAnotherRoleOrRank) {
  ExpectForgedSuccessIgnored(31, "decode-3", 0);
  EXPECT_EQ(CountLines("decode0",
                       "decode:3:decode-3 refused: the CachePD socket takes only prefill keys"),
            1);
  ExpectForgedSuccessIgnored(32, "prefill-1", 0);
  EXPECT_EQ(
      CountLines("decode0", "key prefill:1:prefill-1: a status claiming prefill rank 0 refused"),
      1);
  ExpectForgedSuccessIgnored(33, "decode-5", 0);
}

// The prefill's handshake fetch of a session is a CURVE client of the session's key: a client
// without the decode's key gets no descriptor from it.
TEST_F(CurveTest, TheHandshakeEndpointServesNoPlainClient) {
  absl::StatusOr<v1::HandshakeDescriptor> descriptor =
      transport::FetchDescriptor(d_->decode(0).session_id, absl::Seconds(2));
  EXPECT_FALSE(descriptor.ok()) << "a plain client read the descriptor";
}

// The engine API on tcp with CURVE on: only the engine key of the sidecar's own rank, holding
// the sidecar's public key, is served; a plain client and another rank's engine key get no
// answer at all (their handshakes never complete).
TEST(CurveEngineApiTest, OnlyTheSidecarsOwnEngineKeyIsServed) {
  const std::string keys = TestDir() + "/keys";
  absl::StatusOr<std::unique_ptr<process::Subprocess>> sidecar = process::Subprocess::Start(
      {"tools/kvrail", "sidecar", "--role", "decode", "--engine-endpoint", "tcp://127.0.0.1:0",
       "--host", "127.0.0.1", "--tls", "tcp", "--curve-key", keys + "/decode-0.key",
       "--curve-allowed", TestDir() + "/allowed"},
      {}, OutputsDir() + "/curve-engine-sidecar.log");
  ASSERT_TRUE(sidecar.ok()) << sidecar.status();
  absl::StatusOr<std::string> ready = (*sidecar)->ReadUntil("sidecar ready", absl::Seconds(30));
  ASSERT_TRUE(ready.ok()) << ready.status();
  std::string endpoint;
  for (absl::string_view field : absl::StrSplit(*ready, ' ')) {
    if (absl::ConsumePrefix(&field, "engine=")) endpoint = std::string(field);
  }
  ASSERT_TRUE(absl::StartsWith(endpoint, "tcp://")) << *ready;
  const std::string server = Key("decode-0").public_key;
  v1::EngineRequest stats;
  stats.mutable_stats();
  auto call = [&](const zmq_auth::CurveClientKeys* curve) {
    auto client = engine_api::EngineApiClient::Connect(endpoint, curve);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? (*client)->Call(stats, absl::Seconds(2)).status()
                       : absl::InternalError("no client");
  };
  const zmq_auth::CurveClientKeys engine0{Key("engine-0"), server};
  EXPECT_TRUE(call(&engine0).ok());
  EXPECT_EQ(call(nullptr).code(), absl::StatusCode::kDeadlineExceeded);
  const zmq_auth::CurveClientKeys engine1{Key("engine-1"), server};
  EXPECT_EQ(call(&engine1).code(), absl::StatusCode::kDeadlineExceeded);
  const zmq_auth::CurveClientKeys wrong_server{Key("engine-0"), Key("prefill-0").public_key};
  EXPECT_EQ(call(&wrong_server).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(call(&engine0).ok());  // and the engine is still served
}

}  // namespace
}  // namespace kvrail::hostile
