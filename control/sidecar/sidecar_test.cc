// AttachArena against a real decode sidecar in this process: where the arena may come from,
// and an arena the sidecar allocates itself (allocate_bytes), as an engine maps it.
#include "control/sidecar/sidecar.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "control/engine_api/engine_api.h"
#include "control/engine_api/sidecar_arena.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/small_room.h"
#include "control/sidecar/sidecar_metrics.h"
#include "engine/memory/cuda_arena.h"
#include "engine/metrics/registry.h"

namespace kvrail::sidecar {
namespace {

using layout::testing::SmallContract;

class AttachArenaTest : public ::testing::Test {
 protected:
  void StartSidecar(const std::string& tls, bool verify_digest = false) {
    SidecarOptions options;
    options.role = Role::kDecode;
    options.verify_digest = verify_digest;
    options.engine_endpoint = "tcp://127.0.0.1:0";
    options.tls = tls;
    options.lanes = 1;
    auto started = Sidecar::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    sidecar_ = *std::move(started);
    auto engine = engine_api::EngineApiClient::Connect(sidecar_->engine_endpoint());
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }

  // An AttachArena with this test's contract and the given sources of the arena.
  v1::EngineRequest Attach(const std::string& shm_name, const std::string& cuda_ipc_handle,
                           uint64_t allocate_bytes) const {
    v1::EngineRequest request;
    request.mutable_attach()->set_contract(layout::SerializeContract(contract_).value());
    request.mutable_attach()->set_shm_name(shm_name);
    request.mutable_attach()->set_cuda_ipc_handle(cuda_ipc_handle);
    request.mutable_attach()->set_allocate_bytes(allocate_bytes);
    return request;
  }

  // The error message of a refused request ("" when it was accepted).
  std::string Refusal(const v1::EngineRequest& request) {
    auto reply = engine_->Call(request);
    return reply.ok() ? "" : std::string(reply.status().message());
  }

  const layout::Contract contract_ = SmallContract();
  const uint64_t bytes_ = static_cast<uint64_t>(contract_.ArenaBytes());
  std::unique_ptr<Sidecar> sidecar_;
  std::unique_ptr<engine_api::EngineApiClient> engine_;
};

TEST(SidecarOptionsTest, ANonPositiveWaitIsRefusedNamingItsFlag) {
  SidecarOptions options;
  options.role = Role::kDecode;
  options.engine_endpoint = "tcp://127.0.0.1:0";
  options.timeouts.unmatched_preallocation_timeout = absl::ZeroDuration();
  auto started = Sidecar::Start(options);
  ASSERT_FALSE(started.ok());
  EXPECT_TRUE(
      absl::StrContains(started.status().message(), "--preallocation-wait 0 must be positive"))
      << started.status();
}

TEST_F(AttachArenaTest, AnAttachNamingNoArenaIsRefusedNamingTheThreeFields) {
  StartSidecar("tcp");
  EXPECT_TRUE(absl::StrContains(
      Refusal(Attach("", "", 0)),
      "AttachArena: give exactly one of shm_name, cuda_ipc_handle or allocate_bytes; got none"));
}

// UCX here cannot reach GPU memory, so a CUDA arena is staged through a host mirror (where a
// room digest is hashed: --verify-digest is no reason to refuse it); without a GPU the import
// itself refuses, in one line, and nothing is attached.
TEST_F(AttachArenaTest, ACudaArenaOverUcxIsStagedAndWithoutAGpuRefusedInOneLine) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a GPU is present; nothing to refuse";
  StartSidecar("tcp", /*verify_digest=*/true);
  v1::EngineRequest cuda = Attach("", std::string(64, '\x01'), 0);
  cuda.mutable_attach()->set_cuda_bytes(bytes_);
  const std::string refusal = Refusal(cuda);
  EXPECT_TRUE(absl::StrContains(refusal, "AttachArena: CUDA IPC handle")) << refusal;
  EXPECT_FALSE(absl::StrContains(refusal, "--verify-digest")) << refusal;
  EXPECT_EQ(refusal.find('\n'), std::string::npos) << refusal;
  EXPECT_EQ(Refusal(Attach("", "", bytes_)), "");  // nothing was left attached
}

// A CUDA arena's size and device are checked before anything is imported, each in one line.
TEST_F(AttachArenaTest, ACudaArenaSmallerThanTheContractOrOnNoDeviceIsRefusedNamingIt) {
  StartSidecar("tcp");
  v1::EngineRequest cuda = Attach("", std::string(64, '\x01'), 0);
  cuda.mutable_attach()->set_cuda_bytes(bytes_ - 1);
  std::string refusal = Refusal(cuda);
  EXPECT_TRUE(absl::StrContains(
      refusal, absl::StrCat("cuda_bytes is ", bytes_ - 1, ", less than the ", bytes_, " bytes")))
      << refusal;
  cuda.mutable_attach()->set_cuda_bytes(bytes_);
  cuda.mutable_attach()->set_cuda_device(-1);
  refusal = Refusal(cuda);
  EXPECT_TRUE(absl::StrContains(refusal, "AttachArena: cuda_device -1 is not a device index"))
      << refusal;
  EXPECT_EQ(Refusal(Attach("", "", bytes_)), "");  // nothing was left attached
}

TEST_F(AttachArenaTest, AnAttachNamingTwoArenasIsRefusedNamingThem) {
  StartSidecar("tcp");
  std::string refusal = Refusal(Attach("/kvrail-never-made", "", bytes_));
  EXPECT_TRUE(absl::StrContains(refusal, "got shm_name and allocate_bytes")) << refusal;
  refusal = Refusal(Attach("", std::string(64, 'h'), bytes_));
  EXPECT_TRUE(absl::StrContains(refusal, "got cuda_ipc_handle and allocate_bytes")) << refusal;
  refusal = Refusal(Attach("/kvrail-never-made", std::string(64, 'h'), bytes_));
  EXPECT_TRUE(absl::StrContains(refusal, "got shm_name and cuda_ipc_handle and allocate_bytes"))
      << refusal;
}

TEST_F(AttachArenaTest, AllocateBytesBelowTheContractsArenaIsRefusedNamingBothSizes) {
  StartSidecar("tcp");
  const std::string refusal = Refusal(Attach("", "", bytes_ - 1));
  EXPECT_TRUE(absl::StrContains(refusal, absl::StrCat("allocate_bytes is ", bytes_ - 1,
                                                      ", less than the ", bytes_, " bytes")))
      << refusal;
}

TEST_F(AttachArenaTest, ARefusedAttachLeavesNothingBehindAndTheEngineMayTryAgain) {
  StartSidecar("tcp");
  EXPECT_FALSE(Refusal(Attach("", "", bytes_ - 1)).empty());
  EXPECT_EQ(Refusal(Attach("", "", bytes_)), "");
  EXPECT_TRUE(absl::StrContains(Refusal(Attach("", "", 2 * bytes_)), "attached already"));
}

// A contract that validates but places pages past the arena it sizes (CACHEPD §4.6): the
// reference's own test contracts do. A peer's manifest could then name a page whose bytes lie
// outside the arena, so the attach is refused, naming the field, and nothing is attached.
TEST_F(AttachArenaTest, AContractWhosePagesLieOutsideItsArenaIsRefusedNamingTheField) {
  StartSidecar("tcp");
  layout::Contract beyond = contract_;
  beyond.plan.planes.back().arena_offset_bytes += 2 * beyond.plan.lcm_block_bytes;  // 2 blocks on
  ASSERT_TRUE(layout::ValidateContract(beyond).ok());
  ASSERT_FALSE(layout::CheckArenaFits(beyond).ok());
  v1::EngineRequest request = Attach("", "", bytes_);
  request.mutable_attach()->set_contract(layout::SerializeContract(beyond).value());
  const std::string refusal = Refusal(request);
  EXPECT_TRUE(absl::StrContains(refusal, "AttachArena: contract")) << refusal;
  EXPECT_TRUE(absl::StrContains(refusal, "but the arena holds")) << refusal;
  EXPECT_EQ(Refusal(Attach("", "", bytes_)), "");  // nothing was left attached
}

// An engine that restarted attaches the same arena again: accepted (its earlier rooms fail).
TEST_F(AttachArenaTest, TheSameArenaAttachedAgainIsAReattach) {
  StartSidecar("tcp");
  EXPECT_EQ(Refusal(Attach("", "", bytes_)), "");
  EXPECT_EQ(Refusal(Attach("", "", bytes_)), "");
}

TEST_F(AttachArenaTest, AnAllocatedArenaIsMappedThroughTheReplysPathAndFreedAtStop) {
  StartSidecar("tcp");
  auto reply = engine_->Call(Attach("", "", bytes_));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(absl::StartsWith(reply->arena_path(), absl::StrCat("/proc/", getpid(), "/fd/")))
      << reply->arena_path();
  EXPECT_EQ(reply->arena_placement(), "memfd");  // UCX over tcp only
  auto arena = engine_api::MapSidecarArena(*reply, bytes_);
  ASSERT_TRUE(arena.ok()) << arena.status();
  absl::Span<uint8_t> bytes = arena->bytes();
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; }));
  bytes[bytes_ - 1] = 7;

  // Stop frees the sidecar's memory: its fd is gone. The engine's mapping keeps its pages.
  sidecar_->Stop();
  EXPECT_LT(open(reply->arena_path().c_str(), O_RDWR | O_CLOEXEC), 0) << reply->arena_path();
  EXPECT_EQ(bytes[bytes_ - 1], 7);
}

TEST_F(AttachArenaTest, OverSharedMemoryTheArenaIsUcxsOwnSegment) {
  StartSidecar("sm");
  auto reply = engine_->Call(Attach("", "", bytes_));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->arena_placement(), "ucx-shm");
  auto arena = engine_api::MapSidecarArena(*reply, bytes_);
  ASSERT_TRUE(arena.ok()) << arena.status();
  arena->bytes()[0] = 1;
  EXPECT_EQ(arena->bytes()[0], 1);
}

// A request with a large manifest is parsed off the engine API's thread: another client's Stats,
// sent after it, is answered first, and the large request still gets its own answer.
TEST_F(AttachArenaTest, ALargeManifestDoesNotHoldUpTheEngineApi) {
  StartSidecar("tcp");
  ASSERT_EQ(Refusal(Attach("", "", bytes_)), "");
  layout::Manifest manifest;
  manifest.prompt_len = 16 * 240000;
  for (const layout::GroupSpec& group : contract_.group_specs) {
    layout::ManifestGroup& g = manifest.groups.emplace_back();
    g.group_id = group.group_id;
    for (int64_t i = 0; g.block_ids.size() < 240000; ++i) g.block_ids.push_back(1000000 + i);
  }
  v1::EngineRequest expect;
  expect.mutable_expect()->set_room(5);
  expect.mutable_expect()->set_bootstrap_address("127.0.0.1:1");
  expect.mutable_expect()->set_destination_manifest(layout::SerializeManifest(manifest).value());
  ASSERT_GT(expect.expect().destination_manifest().size(), size_t{1} << 20);
  const uint64_t id = engine_->Send(expect).value();
  auto other = engine_api::EngineApiClient::Connect(sidecar_->engine_endpoint()).value();
  v1::EngineRequest stats;  // open to any client, as a monitor would ask
  stats.mutable_stats();
  ASSERT_TRUE(other->Call(stats).ok());
  auto early = engine_->NextMessage(absl::ZeroDuration());
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(early->has_value()) << "the large Expect was answered before the Poll";
  std::optional<v1::SidecarMessage> answer = engine_->NextMessage(absl::Seconds(30)).value();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->reply().request_id(), id);
  EXPECT_TRUE(absl::StrContains(answer->reply().error(), "Expect room 5: destination manifest"))
      << answer->reply().error();
}

// GET /metrics' registry sees a room fail: counted under its cause, its duration observed, and
// named as the last failure.
TEST_F(AttachArenaTest, AFailedRoomIsCountedByCauseInTheMetrics) {
  StartSidecar("tcp");
  ASSERT_EQ(Refusal(Attach("", "", bytes_)), "");
  const std::vector<std::vector<int64_t>> tables(contract_.group_specs.size(), {1});
  v1::EngineRequest expect;
  expect.mutable_expect()->set_room(11);
  expect.mutable_expect()->set_bootstrap_address("127.0.0.1:1");  // nobody listens there
  expect.mutable_expect()->set_destination_manifest(
      layout::SerializeManifest(layout::BuildManifest(contract_, tables, 0, 16).value()).value());
  ASSERT_TRUE(engine_->Call(expect).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::optional<v1::RoomEvent> failed;
  while (!failed && absl::Now() < deadline) {
    std::optional<v1::RoomEvent> event = engine_->NextEvent(absl::Seconds(1));
    if (event && event->status() == v1::TRANSFER_POLL_FAILED) failed = *event;
  }
  ASSERT_TRUE(failed.has_value()) << "room 11 did not fail";
  const std::string text = sidecar_->metrics().Expose();
  // The event says why as a word for code (RoomEvent.cause), the one the metrics count under.
  const std::string cause = failed->cause();
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("kvrail_rooms_total{outcome=\"failed\",cause=\"", cause, "\"} 1\n")))
      << failed->reason() << "\n"
      << text;
  EXPECT_EQ(cause, "bootstrap") << failed->reason();  // nobody listens at its bootstrap
  EXPECT_TRUE(absl::StrContains(text, "kvrail_room_duration_seconds_count 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(
      text, "kvrail_last_failure_info{cause=\"" + cause + "\",room=\"11\",reason=\""))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "kvrail_arena_bytes{placement=\"memfd\"}")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvrail_sidecar_info{role=\"decode\",tp_rank=\"0\"")) << text;
  // The data plane's tables: the allocated arena is its one region; a decode opens no endpoint
  // (its prefills' reach it) and holds no registration back (a prefill's gate).
  EXPECT_TRUE(absl::StrContains(text, "kvrail_table_entries{table=\"regions\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvrail_table_entries{table=\"endpoints\"} 0\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "kvrail_table_entries{table=\"registrations_held\"} 0\n"))
      << text;
}

}  // namespace
}  // namespace kvrail::sidecar
