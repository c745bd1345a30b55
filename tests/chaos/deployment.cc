#include "tests/chaos/deployment.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "control/layout/kv_shape.h"
#include "engine/base/error.h"
#include "engine/memory/pattern.h"
#include "tests/support/byte_count.h"
#include "tests/support/kvrail_binary.h"

namespace kvrail::chaos {
namespace {

constexpr uint64_t kPatternSeed = 41;

std::string LogDir() {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return dir != nullptr ? dir : "/tmp";
}

}  // namespace

std::string Deployment::LogPath(const std::string& rank) {
  // The cluster's member names: "prefill" is prefill sidecar 0, "decode<d>" decode sidecar d.
  std::string member = rank;
  if (rank == "prefill") member = cluster::SidecarName("prefill", 0);
  if (absl::StartsWith(rank, "decode")) {
    member = cluster::SidecarName("decode", std::stoi(rank.substr(6)));
  }
  return absl::StrCat(LogDir(), "/", member, ".log");
}

DeploymentOptions TwoDecodes(const char* tls) {
  DeploymentOptions options;
  options.tls = tls;
  options.decodes = 2;
  options.pages = 33;
  options.prefill_args = {"--transfer-deadline",  "2", "--fence-timeout", "1",
                          "--heartbeat-interval", "2"};
  options.decode_args = {"--heartbeat-interval", "2", "--fence-wait", "5"};
  return options;
}

absl::StatusOr<std::unique_ptr<Deployment>> Deployment::Start(DeploymentOptions options) {
  std::unique_ptr<Deployment> deployment(new Deployment(std::move(options)));
  KVRAIL_RETURN_IF_ERROR(deployment->StartAll());
  return deployment;
}

Deployment::~Deployment() {
  for (Rank& rank : decodes_) rank.engine.reset();
  prefill_.engine.reset();
  if (cluster_) cluster_->Stop();  // continues the stopped, then stops every process
}

absl::Status Deployment::StartAll() {
  tag_ = process::ProcessTag();
  layout::KvShape shape;
  shape.pages = options_.pages;
  KVRAIL_ASSIGN_OR_RETURN(contract_, layout::BuildKvContract(shape, 1));
  cluster::ClusterOptions o;
  o.kvrail = testing::KvrailBinary();
  o.prefill_tp = 1;
  o.decode_tp = 1;
  o.decode_instances = options_.decodes;
  // "sm" and "tcp" are UCX's transports; "verbs" is the verbs backend over the software
  // provider, a rail on each of the sidecar's network devices, so a device set down there cuts
  // the rail as it cuts tcp.
  o.link = options_.tls == "sm" ? "shm" : options_.tls;
  if (options_.tls == "verbs") o.verbs_provider = "softverbs";
  o.engine_sims = false;  // the test is the engine
  o.prefill_node = {options_.prefill_prefix, options_.prefill_host, options_.net_devices};
  o.decode_node = {options_.decode_prefix, options_.decode_host, options_.decode_net_devices};
  o.prefill_args = options_.prefill_args;
  o.decode_args = options_.decode_args;
  o.prefill_env = options_.prefill_env;
  o.bootstrap_args = options_.bootstrap_args;
  o.log_dir = LogDir();
  KVRAIL_ASSIGN_OR_RETURN(cluster_, cluster::Cluster::Start(o));
  bootstrap_address_ = cluster_->bootstrap();
  prefill_.name = "prefill";
  Bind(prefill_, cluster_->prefill_sidecar(0));
  KVRAIL_RETURN_IF_ERROR(AttachRank(prefill_, true));
  for (int d = 0; d < options_.decodes; ++d) {
    Rank rank;
    rank.name = absl::StrCat("decode", d);
    Bind(rank, cluster_->decode_sidecar(d));
    decodes_.push_back(std::move(rank));
    KVRAIL_RETURN_IF_ERROR(AttachRank(decodes_.back(), false));
  }
  // Warm up: one block to every decode, so that handshakes and connections are made.
  for (int d = 0; d < options_.decodes; ++d) {
    KVRAIL_RETURN_IF_ERROR(MoveRoom(d, 1000000 + d, Blocks(1, 1)));
  }
  return absl::OkStatus();
}

void Deployment::Bind(Rank& rank, cluster::Member& member) {
  rank.sidecar = member.process.get();
  rank.engine_endpoint = member.engine_endpoint;
  rank.cachepd_endpoint = member.cachepd_endpoint;
  rank.session_id = member.session_id;
}

absl::Status Deployment::MoveRoom(int d, uint64_t room, const layout::Manifest& manifest,
                                  absl::Duration timeout) {
  const std::string what = absl::StrCat("room ", room, " to decode ", d);
  KVRAIL_RETURN_IF_ERROR(Expect(d, room, manifest));
  KVRAIL_RETURN_IF_ERROR(Ready(room, manifest));
  KVRAIL_ASSIGN_OR_RETURN(v1::RoomEvent done, Event(decodes_[d], room, timeout));
  if (done.status() != v1::TRANSFER_POLL_SUCCESS) {
    return absl::InternalError(absl::StrCat(what, " failed on the decode: ", done.reason()));
  }
  KVRAIL_ASSIGN_OR_RETURN(v1::RoomEvent sent, Event(prefill_, room, timeout));
  if (sent.status() != v1::TRANSFER_POLL_SUCCESS) {
    return absl::InternalError(absl::StrCat(what, " failed on the prefill: ", sent.reason()));
  }
  if (!Landed(d, manifest)) {
    return absl::DataLossError(absl::StrCat(what, ": Success, but its bytes differ"));
  }
  return absl::OkStatus();
}

absl::Status Deployment::AttachRank(Rank& rank, bool prefill) {
  if (!rank.arena) {
    rank.arena_name = absl::StrCat("/kvrail-chaos-", tag_, "-", rank.name);
    KVRAIL_ASSIGN_OR_RETURN(Arena arena,
                            Arena::CreateShared(rank.arena_name, contract_.ArenaBytes()));
    rank.arena = std::move(arena);
    if (prefill) FillPattern(absl::MakeSpan(rank.arena->data(), rank.arena->size()), kPatternSeed);
  }
  KVRAIL_ASSIGN_OR_RETURN(rank.engine, engine_api::EngineApiClient::Connect(rank.engine_endpoint));
  v1::EngineRequest attach;
  attach.mutable_attach()->set_shm_name(rank.arena_name);
  KVRAIL_ASSIGN_OR_RETURN(*attach.mutable_attach()->mutable_contract(),
                          layout::SerializeContract(contract_));
  // A restarted engine that kept its token takes over at once, even while the sidecar still
  // counts the old engine's connection as open.
  attach.mutable_attach()->set_engine_token(rank.engine_token);
  KVRAIL_ASSIGN_OR_RETURN(v1::EngineReply reply, rank.engine->Call(attach, absl::Seconds(30)));
  rank.engine_token = reply.engine_token();
  return absl::OkStatus();
}

layout::Manifest Deployment::Blocks(int64_t first, int64_t blocks) const {
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < blocks; ++b) ids.push_back(first + b);
  const std::vector<std::vector<int64_t>> table = {ids};
  return layout::BuildManifest(contract_, table, 0, blocks * 16).value();
}

absl::Status Deployment::Expect(int d, uint64_t room, const layout::Manifest& manifest) {
  v1::EngineRequest expect;
  expect.mutable_expect()->set_room(room);
  expect.mutable_expect()->set_bootstrap_address(bootstrap_address_);
  KVRAIL_ASSIGN_OR_RETURN(*expect.mutable_expect()->mutable_destination_manifest(),
                          layout::SerializeManifest(manifest));
  return decodes_[d].engine->Call(expect).status();
}

absl::Status Deployment::Ready(uint64_t room, const layout::Manifest& manifest) {
  v1::EngineRequest ready;
  ready.mutable_ready()->set_room(room);
  ready.mutable_ready()->set_bootstrap_token(7);
  KVRAIL_ASSIGN_OR_RETURN(*ready.mutable_ready()->mutable_source_manifest(),
                          layout::SerializeManifest(manifest));
  return prefill_.engine->Call(ready).status();
}

absl::Status Deployment::Abort(Rank& rank, uint64_t room, const std::string& reason) {
  v1::EngineRequest abort;
  abort.mutable_abort()->set_room(room);
  abort.mutable_abort()->set_reason(reason);
  return rank.engine->Call(abort).status();
}

absl::StatusOr<v1::RoomEvent> Deployment::Event(Rank& rank, uint64_t room, absl::Duration timeout) {
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->first == rank.name && it->second.room() == room) {
      v1::RoomEvent event = std::move(it->second);
      kept_.erase(it);
      return event;
    }
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::optional<v1::RoomEvent> event = rank.engine->NextEvent(deadline - absl::Now());
    if (!event) break;
    if (event->room() == room) return *event;
    kept_.emplace_back(rank.name, *std::move(event));
  }
  return absl::DeadlineExceededError(absl::StrCat("no event for room ", room, " from ", rank.name,
                                                  " within ", absl::FormatDuration(timeout)));
}

absl::StatusOr<v1::RoomEvent> Deployment::PagesFree(int d, uint64_t room, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    KVRAIL_ASSIGN_OR_RETURN(v1::RoomEvent event, Event(decodes_[d], room, deadline - absl::Now()));
    if (event.status() == v1::TRANSFER_POLL_SUCCESS) {
      return absl::FailedPreconditionError(
          absl::StrCat("room ", room, " succeeded on ", decodes_[d].name));
    }
    if (event.pages() == v1::PAGES_REUSABLE) return event;
  }
}

bool Deployment::Landed(int d, const layout::Manifest& manifest) const {
  const uint8_t* source = prefill_.arena->data();
  const uint8_t* landed = decodes_[d].arena->data();
  for (const layout::FieldLayout& field : contract_.plan.fields) {
    const int64_t bytes = layout::PayloadBytes(field);
    for (const layout::ManifestGroup& group : manifest.groups) {
      for (int64_t block : group.block_ids) {
        const int64_t offset = layout::PageOffset(contract_, field, block).value();
        if (std::memcmp(source + offset, landed + offset, bytes) != 0) return false;
      }
    }
  }
  return true;
}

std::vector<uint8_t> Deployment::Snapshot(int d) const {
  const Arena& arena = *decodes_[d].arena;
  return std::vector<uint8_t>(arena.data(), arena.data() + arena.size());
}

uint64_t Deployment::Changed(int d, const std::vector<uint8_t>& before) const {
  return kvrail::testing::CountBytesDiffering(decodes_[d].arena->data(), before.data(),
                                              before.size());
}

uint64_t Deployment::OverwrittenWithin(int d, absl::Duration watch) {
  constexpr uint8_t kMarker = 0x5A;
  Arena& arena = *decodes_[d].arena;
  std::memset(arena.data(), kMarker, arena.size());
  absl::SleepFor(watch);
  return kvrail::testing::CountBytesNot(arena.data(), arena.size(), kMarker);
}

absl::Status Deployment::ReconnectDecodeEngine(int d) {
  decodes_[d].engine.reset();
  return AttachRank(decodes_[d], false);
}

absl::Status Deployment::RestartBootstrap() { return cluster_->RestartBootstrap(); }

absl::Status Deployment::RestartDecode(int d) {
  Rank& rank = decodes_[d];
  rank.engine.reset();
  KVRAIL_RETURN_IF_ERROR(cluster_->RestartDecodeSidecar(d));
  Bind(rank, cluster_->decode_sidecar(d));
  return AttachRank(rank, false);
}

absl::StatusOr<v1::SidecarStats> Deployment::Stats(Rank& rank) {
  v1::EngineRequest request;
  request.mutable_stats();
  KVRAIL_ASSIGN_OR_RETURN(v1::EngineReply reply, rank.engine->Call(request));
  return reply.stats();
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> Deployment::RssAndFds(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  uint64_t rss = 0;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      std::istringstream words(line.substr(6));
      words >> rss;
    }
  }
  if (rss == 0) return absl::NotFoundError(absl::StrCat("no VmRSS for pid ", pid));
  uint64_t fds = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    (void)entry;
    ++fds;
  }
  return std::make_pair(rss, fds);
}

}  // namespace kvrail::chaos
