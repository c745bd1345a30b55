#include "tests/chaos/deployment.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/sidecar_command.h"
#include "control/layout/kv_shape.h"
#include "engine/base/error.h"
#include "engine/memory/pattern.h"
#include "tests/support/byte_count.h"
#include "tests/support/kvrail_binary.h"

namespace kvrail::chaos {
namespace {

constexpr uint64_t kPatternSeed = 41;

std::string LogPath(const std::string& name) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name, ".log");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Deployment>> Deployment::Start(DeploymentOptions options) {
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<Deployment> deployment(new Deployment(std::move(options)));
  KVRAIL_RETURN_IF_ERROR(deployment->StartAll());
  return deployment;
}

Deployment::~Deployment() {
  for (Rank& rank : decodes_) {
    rank.engine.reset();
    if (rank.sidecar) rank.sidecar->Signal(SIGCONT);
    if (rank.sidecar) rank.sidecar->Stop();
  }
  prefill_.engine.reset();
  if (prefill_.sidecar) {
    prefill_.sidecar->Signal(SIGCONT);
    prefill_.sidecar->Stop();
  }
  if (bootstrap_) bootstrap_->Stop();
}

absl::Status Deployment::StartAll() {
  tag_ = process::ProcessTag();
  layout::KvShape shape;
  shape.pages = options_.pages;
  KVRAIL_ASSIGN_OR_RETURN(contract_, layout::BuildKvContract(shape, 1));
  const std::string bind = options_.prefill_prefix.empty() ? "127.0.0.1" : options_.prefill_host;
  std::vector<std::string> argv = options_.prefill_prefix;
  for (const std::string& a :
       {testing::KvrailBinary(), std::string("bootstrap"), std::string("--host"), bind,
        std::string("--port"), std::string("0")}) {
    argv.push_back(a);
  }
  const size_t port_arg = argv.size() - 1;
  argv.insert(argv.end(), options_.bootstrap_args.begin(), options_.bootstrap_args.end());
  KVRAIL_ASSIGN_OR_RETURN(bootstrap_,
                          process::Subprocess::Start(argv, {}, LogPath("chaos-bootstrap")));
  KVRAIL_ASSIGN_OR_RETURN(const int port, process::AwaitAnnouncedPort(
                                              *bootstrap_, "bootstrap ready", absl::Seconds(30)));
  argv[port_arg] = absl::StrCat(port);  // a restart binds the port the sidecars know
  bootstrap_argv_ = argv;
  bootstrap_address_ = absl::StrCat(bind, ":", port);
  KVRAIL_ASSIGN_OR_RETURN(prefill_, StartRank("prefill", true));
  KVRAIL_RETURN_IF_ERROR(AttachRank(prefill_, true));
  for (int d = 0; d < options_.decodes; ++d) {
    KVRAIL_ASSIGN_OR_RETURN(Rank rank, StartRank(absl::StrCat("decode", d), false));
    decodes_.push_back(std::move(rank));
    KVRAIL_RETURN_IF_ERROR(AttachRank(decodes_.back(), false));
  }
  // Warm up: one block to every decode, so that handshakes and connections are made.
  for (int d = 0; d < options_.decodes; ++d) {
    KVRAIL_RETURN_IF_ERROR(MoveRoom(d, 1000000 + d, Blocks(1, 1)));
  }
  return absl::OkStatus();
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

absl::StatusOr<Rank> Deployment::StartRank(const std::string& name, bool prefill) {
  Rank rank;
  rank.name = name;
  rank.engine_endpoint = absl::StrCat("ipc:///tmp/kvrail-chaos-", tag_, "-", name, ".sock");
  cluster::SidecarCommand command;
  command.kvrail = testing::KvrailBinary();
  command.prefix = prefill ? options_.prefill_prefix : options_.decode_prefix;
  command.role = prefill ? "prefill" : "decode";
  command.engine_endpoint = rank.engine_endpoint;
  command.host = prefill ? options_.prefill_host : options_.decode_host;
  // "sm" and "tcp" are UCX's transports; "verbs" is the verbs backend over the software
  // provider, a rail on each of the sidecar's network devices, so a device set down there cuts
  // the rail as it cuts tcp.
  command.link = options_.tls == "sm" ? "shm" : options_.tls;
  if (options_.tls == "verbs") command.verbs_provider = "softverbs";
  command.net_devices = prefill ? options_.net_devices : options_.decode_net_devices;
  if (prefill) command.bootstrap = bootstrap_address_;
  command.args = prefill ? options_.prefill_args : options_.decode_args;
  cluster::Command line = cluster::SidecarCommandLine(command);
  if (prefill) line.env.insert(options_.prefill_env.begin(), options_.prefill_env.end());
  KVRAIL_ASSIGN_OR_RETURN(
      rank.sidecar,
      process::Subprocess::Start(line.argv, line.env, LogPath(absl::StrCat("chaos-", name))));
  KVRAIL_ASSIGN_OR_RETURN(const std::string ready,
                          rank.sidecar->ReadUntil("sidecar ready", absl::Seconds(30)));
  // "sidecar ready engine=... cachepd=... session=..."
  for (absl::string_view field : absl::StrSplit(ready, ' ')) {
    if (absl::ConsumePrefix(&field, "cachepd=")) rank.cachepd_endpoint = std::string(field);
    if (absl::ConsumePrefix(&field, "session=")) rank.session_id = std::string(field);
  }
  return rank;
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

absl::Status Deployment::ReconnectDecodeEngine(int d) {
  decodes_[d].engine.reset();
  return AttachRank(decodes_[d], false);
}

absl::Status Deployment::RestartBootstrap() {
  bootstrap_->Signal(SIGKILL);
  bootstrap_.reset();
  // The same port as before, which the sidecars know; retries cover another process that
  // bound it in the moment it was free.
  absl::Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    KVRAIL_ASSIGN_OR_RETURN(
        bootstrap_, process::Subprocess::Start(bootstrap_argv_, {}, LogPath("chaos-bootstrap")));
    last = process::AwaitAnnouncedPort(*bootstrap_, "bootstrap ready", absl::Seconds(10)).status();
    if (last.ok()) return last;
  }
  return last;
}

absl::Status Deployment::RestartDecode(int d) {
  Rank& rank = decodes_[d];
  rank.engine.reset();
  rank.sidecar->Signal(SIGKILL);
  rank.sidecar.reset();
  KVRAIL_ASSIGN_OR_RETURN(Rank fresh, StartRank(rank.name, false));
  rank.sidecar = std::move(fresh.sidecar);
  rank.cachepd_endpoint = fresh.cachepd_endpoint;
  rank.session_id = fresh.session_id;
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
