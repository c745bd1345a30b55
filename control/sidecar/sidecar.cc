#include "control/sidecar/sidecar.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "control/bootstrap/client.h"
#include "control/engine_api/engine_api.h"
#include "control/error/error.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/pipeline.h"
#include "control/plan/planner.h"
#include "control/session/decode_rooms.h"
#include "control/session/prefill_rooms.h"
#include "control/session/zmq_channel.h"
#include "engine/memory/arena.h"
#include "engine/memory/cuda_arena.h"
#include "engine/transfer/peer_directory.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/factory.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/transport/transport.h"

namespace kvrail::sidecar {
namespace {

using session::TransferPoll;

bool Terminal(TransferPoll state) {
  return state == TransferPoll::kSuccess || state == TransferPoll::kFailed;
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address,
                                                          const char* what) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", address, "\": expected <host>:<port> with a port in 1..65535"));
  }
  return std::make_pair(address.substr(0, colon), port);
}

// One thread running jobs in order.
class Worker {
 public:
  Worker() : thread_([this] { Run(); }) {}
  ~Worker() { Stop(); }
  void Post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

struct Sidecar::Impl {
  SidecarOptions options;
  std::string role_name;

  std::shared_ptr<session::ZmqContext> zmq;
  std::unique_ptr<session::ZmqInbox> inbox;
  std::unique_ptr<session::ZmqOutbox> outbox;
  std::unique_ptr<engine_api::EngineApiServer> api;
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transport::HandshakeServer> handshake;    // decode
  std::unique_ptr<transport::DescriptorCache> descriptors;  // prefill
  std::unique_ptr<transfer::PeerDirectory> directory;       // prefill
  std::unique_ptr<transfer::Scheduler> scheduler;           // prefill
  std::string session_id;
  std::string empty;

  // The attached arena: named shared memory, CUDA memory, or memory the transport allocated
  // (AttachArena.allocate_bytes; registered by Allocate, freed by Deregister).
  std::optional<Arena> host_arena;
  std::optional<CudaArena> cuda_arena;
  std::optional<transport::SharedRegion> allocated;
  transport::RegionId region = 0;
  uint64_t arena_base = 0;
  uint64_t arena_bytes = 0;

  std::mutex mu;  // guards everything below
  bool attached = false;
  std::optional<session::PrefillRooms> prefill;
  std::optional<session::DecodeRooms> decode;
  // Terminal states whose events were published, for Poll (bounded, oldest first out).
  std::map<uint64_t, std::pair<TransferPoll, std::string>> finished;
  std::deque<uint64_t> finished_order;
  // Prefill: transfers of a room in flight, and what each transfer id belongs to.
  struct RoomTransfers {
    int pending = 0;
    bool failed = false;
    uint64_t bytes = 0;
    uint64_t copies = 0;
    absl::Time started;
    std::vector<uint64_t> ids;
  };
  std::map<uint64_t, RoomTransfers> transfers;
  struct TransferOwner {
    uint64_t room;
    std::string session;
  };
  std::map<uint64_t, TransferOwner> transfer_owner;
  uint64_t next_transfer_id = 1;
  // Decode: per bootstrap address, the node's description and planner, and rank endpoints.
  struct PrefillNode {
    plan::PrefillDescription description;
    plan::DecodeTargets targets;  // this decode rank's E_d, Z_d, T_d against the node
    std::map<std::pair<int, int>, std::string> endpoints;  // (dp group, rank) -> tcp://
  };
  std::map<std::string, std::shared_ptr<PrefillNode>> nodes;
  SidecarStats stats;

  std::atomic<bool> stop{false};
  std::thread inbox_thread;
  std::thread ticker_thread;
  Worker worker;

  // --- output -------------------------------------------------------------------------------

  void Publish(const session::RoomEvent& event, uint64_t bytes = 0, uint64_t copies = 0,
               double seconds = 0) {
    if (!Terminal(event.state)) return;
    v1::RoomEvent out;
    out.set_room(event.room);
    out.set_status(static_cast<v1::TransferPoll>(static_cast<int>(event.state)));
    out.set_reason(event.reason);
    out.set_bootstrap_token(event.bootstrap_token);
    if (event.spec_candidate_ids) {
      for (int32_t id : *event.spec_candidate_ids) out.add_speculative_ids(id);
    }
    out.set_bytes(bytes);
    out.set_copies(copies);
    out.set_seconds(seconds);
    api->Publish(out);
  }

  // Records a terminal room for Poll and frees it from the state machine (needs mu).
  void FinishLocked(const session::RoomEvent& event) {
    if (!Terminal(event.state)) return;
    if (finished.emplace(event.room, std::make_pair(event.state, event.reason)).second) {
      finished_order.push_back(event.room);
      while (finished_order.size() > options.remembered_rooms) {
        finished.erase(finished_order.front());
        finished_order.pop_front();
      }
    }
    if (event.state == TransferPoll::kSuccess) {
      ++stats.rooms_succeeded;
    } else {
      ++stats.rooms_failed;
      spdlog::warn("{} room {} failed: {}", role_name, event.room, event.reason);
    }
    if (prefill) prefill->Free(event.room, absl::Now());
    if (decode) decode->Free(event.room);
  }

  // Pushes `messages` in order. A message that cannot be queued (the peer's queue is full or
  // it is gone) must not leave a room waiting for ever: a decode fails the room whose
  // pre-allocation was lost; a prefill's lost status is logged (its decode's waiting timeout
  // and heartbeat still end the room there). Returns the rooms to fail.
  std::vector<std::pair<uint64_t, std::string>> SendLocked(
      const std::vector<session::OutboundMessage>& messages) {
    std::vector<std::pair<uint64_t, std::string>> lost;
    for (const session::OutboundMessage& m : messages) {
      const absl::Status sent = outbox->Send(m.endpoint, m.frames);
      if (sent.ok()) continue;
      spdlog::warn("{}: sending to {} failed: {}", role_name, m.endpoint,
                   std::string(sent.message()));
      uint64_t room = 0;
      if (!m.frames.empty() && absl::SimpleAtoi(m.frames[0], &room)) {
        lost.emplace_back(room,
                          absl::StrCat("sending to ", m.endpoint, " failed: ", sent.message()));
      }
    }
    return lost;
  }

  void ApplyLocked(session::PrefillOutput out) {
    (void)SendLocked(out.messages);
    for (const session::RoomEvent& event : out.events) {
      auto t = transfers.find(event.room);
      if (t != transfers.end() && Terminal(event.state)) {
        Publish(event, t->second.bytes, t->second.copies,
                absl::ToDoubleSeconds(absl::Now() - t->second.started));
      } else {
        Publish(event);
      }
      FinishLocked(event);
    }
    for (session::TransferWork& work : out.transfers) {
      worker.Post([this, work = std::move(work)]() mutable { StartTransfer(std::move(work)); });
    }
  }

  void ApplyLocked(session::DecodeOutput out) {
    for (const auto& [room, reason] : SendLocked(out.messages)) {
      session::DecodeOutput failed = decode->Fail(room, reason, absl::Now());
      out.events.insert(out.events.end(), failed.events.begin(), failed.events.end());
    }
    for (const session::RoomEvent& event : out.events) {
      Publish(event);
      FinishLocked(event);
    }
    for (const std::string& dead : out.dead_prefills) {
      spdlog::warn("decode: prefill node {} declared dead (heartbeat)", dead);
      nodes.erase(dead);
    }
  }

  // --- engine API -------------------------------------------------------------------------

  v1::EngineReply Handle(const v1::EngineRequest& request) {
    v1::EngineReply reply;
    absl::Status status;
    switch (request.kind_case()) {
      case v1::EngineRequest::kAttach:
        status = Attach(request.attach(), reply);
        break;
      case v1::EngineRequest::kReady:
        status = Ready(request.ready());
        break;
      case v1::EngineRequest::kExpect:
        status = Expect(request.expect());
        break;
      case v1::EngineRequest::kPoll:
        Poll(request.poll(), reply);
        break;
      case v1::EngineRequest::kAbort:
        status = Abort(request.abort());
        break;
      default:
        status = absl::InvalidArgumentError("unknown request");
    }
    if (!status.ok()) reply.set_error(DescribeError(status));
    return reply;
  }

  // The node's stages: the engine's fields_by_stage, or the contract's fields in plan order
  // cut into pp_size runs of whole layers ("layer.<N>." prefixes).
  absl::StatusOr<plan::PipelineLayout> StageLayout(const v1::AttachArena& attach,
                                                   const layout::Contract& contract) const {
    plan::PipelineLayout pipeline;
    pipeline.pp_size = options.pp_size;
    if (attach.fields_by_stage_size() > 0) {
      for (const v1::FieldList& stage : attach.fields_by_stage()) {
        pipeline.fields_by_stage.emplace_back(stage.field_ids().begin(), stage.field_ids().end());
      }
    } else {
      std::vector<std::string> layers;  // distinct layer prefixes, in plan order
      for (const layout::FieldLayout& field : contract.plan.fields) {
        const std::string prefix = field.field_id.substr(0, field.field_id.rfind('.'));
        if (layers.empty() || layers.back() != prefix) layers.push_back(prefix);
      }
      pipeline.fields_by_stage.resize(options.pp_size);
      for (const layout::FieldLayout& field : contract.plan.fields) {
        const std::string prefix = field.field_id.substr(0, field.field_id.rfind('.'));
        const size_t layer = std::find(layers.begin(), layers.end(), prefix) - layers.begin();
        const size_t stage = layer * options.pp_size / layers.size();
        pipeline.fields_by_stage[stage].push_back(field.field_id);
      }
    }
    KVRAIL_RETURN_IF_ERROR(AddContext(plan::ValidatePipelineLayout(pipeline, contract),
                                      "AttachArena: fields_by_stage"));
    return pipeline;
  }

  // AttachArena. A refused attach leaves nothing behind, so the engine may try again.
  absl::Status Attach(const v1::AttachArena& attach, v1::EngineReply& reply) {
    std::lock_guard<std::mutex> lock(mu);
    if (attached) return absl::FailedPreconditionError("AttachArena: an arena is attached already");
    const absl::Status status = AttachLocked(attach, reply);
    if (!status.ok()) ReleaseArenaLocked();
    return status;
  }

  absl::Status AttachLocked(const v1::AttachArena& attach, v1::EngineReply& reply) {
    absl::StatusOr<layout::Contract> contract = layout::ParseContract(attach.contract());
    if (!contract.ok()) return AddContext(contract.status(), "AttachArena: contract");
    KVRAIL_RETURN_IF_ERROR(
        AddContext(layout::ValidateContract(*contract), "AttachArena: contract"));
    std::vector<std::string> sources;  // where the engine says the arena lives
    if (!attach.shm_name().empty()) sources.push_back("shm_name");
    if (!attach.cuda_ipc_handle().empty()) sources.push_back("cuda_ipc_handle");
    if (attach.allocate_bytes() != 0) sources.push_back("allocate_bytes");
    if (sources.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AttachArena: give exactly one of shm_name, cuda_ipc_handle or allocate_bytes; got ",
          sources.empty() ? "none" : absl::StrJoin(sources, " and ")));
    }
    const uint64_t needed = static_cast<uint64_t>(contract->ArenaBytes());
    transport::LocalRegion region;
    if (!attach.shm_name().empty()) {
      absl::StatusOr<Arena> arena = Arena::OpenShared(attach.shm_name());
      if (!arena.ok()) return AddContext(arena.status(), "AttachArena");
      host_arena = *std::move(arena);
      region = {host_arena->data(), host_arena->size(), false};
    } else if (!attach.cuda_ipc_handle().empty()) {
      absl::StatusOr<CudaArena> arena =
          ImportCudaIpc(attach.cuda_ipc_handle(), attach.cuda_bytes(), attach.cuda_device());
      if (!arena.ok()) return AddContext(arena.status(), "AttachArena: CUDA IPC handle");
      cuda_arena = *std::move(arena);
      region = {cuda_arena->data(), cuda_arena->size(), true};
    } else {
      if (needed > attach.allocate_bytes()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "AttachArena: allocate_bytes is %d, less than the %d bytes the contract describes "
            "(CACHEPD §4.6)",
            attach.allocate_bytes(), needed));
      }
      // Allocate registers the memory itself: no Register below.
      absl::StatusOr<transport::SharedRegion> shared = transport->Allocate(attach.allocate_bytes());
      if (!shared.ok()) {
        return AddContext(shared.status(),
                          absl::StrCat("AttachArena: allocating ", attach.allocate_bytes(),
                                       " bytes on the data plane"));
      }
      allocated = *std::move(shared);
      this->region = allocated->region;
      region = {allocated->base, allocated->length, false};
    }
    if (needed > region.length) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "AttachArena: the contract describes %d bytes, the arena holds only %d (CACHEPD §4.6)",
          needed, region.length));
    }
    if (!allocated) {
      absl::StatusOr<transport::RegionId> id = transport->Register(region);
      if (!id.ok()) return AddContext(id.status(), "AttachArena: registering with the data plane");
      this->region = *id;
    }
    contract_copy = *contract;
    arena_base = reinterpret_cast<uintptr_t>(region.base);
    arena_bytes = region.length;
    if (options.role == Role::kPrefill) {
      session::PrefillIdentity identity;
      identity.prefill_tp_size = options.tp_size;
      identity.prefill_tp_rank = options.tp_rank;
      identity.status_rank =
          plan::GlobalPrefillRank(options.pp_rank, options.tp_size, options.tp_rank);
      identity.contract = *contract;
      std::optional<plan::PipelineLayout> pipeline;
      if (options.pp_size > 1) {
        KVRAIL_ASSIGN_OR_RETURN(pipeline, StageLayout(attach, *contract));
        identity.stage = pipeline->FilterFor(options.pp_rank);
      }
      session::PrefillOptions prefill_options;
      prefill_options.timeouts = options.timeouts;
      prefill_options.max_room_bytes = options.max_room_bytes;
      KVRAIL_ASSIGN_OR_RETURN(session::PrefillRooms rooms,
                              session::PrefillRooms::Create(identity, prefill_options));
      prefill.emplace(std::move(rooms));
      // Register with the node's bootstrap server (CACHEPD §1.2, §2.1).
      KVRAIL_ASSIGN_OR_RETURN(auto server, SplitHostPort(options.bootstrap, "--bootstrap"));
      bootstrap::BootstrapClient client(server.first, server.second);
      bootstrap::PrefillRegistration registration;
      registration.world_size = options.tp_size * options.dp_size * options.pp_size;
      registration.dp_size = options.dp_size;
      registration.endpoint.rank_ip = options.host;
      registration.endpoint.rank_port = inbox->port();
      // Ranks of a DP group are numbered stage-major (control/plan/pipeline.h).
      registration.engine_rank =
          options.dp_rank * options.tp_size * options.pp_size + identity.status_rank;
      registration.contract = *contract;
      registration.pipeline = pipeline;
      KVRAIL_RETURN_IF_ERROR(
          AddContext(client.RegisterPrefillRank(registration), "registering with the bootstrap"));
    } else {
      session::DecodeIdentity identity;
      identity.endpoint = options.host;
      identity.port = inbox->port();
      identity.session_id = session_id;
      identity.arena_base = arena_base;
      identity.contract = *contract;
      identity.decode_tp_size = options.tp_size;
      identity.decode_tp_rank = options.tp_rank;
      session::DecodeOptions decode_options;
      decode_options.timeouts = options.timeouts;
      KVRAIL_ASSIGN_OR_RETURN(session::DecodeRooms rooms,
                              session::DecodeRooms::Create(identity, decode_options));
      decode.emplace(std::move(rooms));
    }
    attached = true;
    if (allocated) {
      reply.set_arena_path(absl::StrCat("/proc/", getpid(), "/fd/", allocated->fd));
      reply.set_arena_offset(allocated->fd_offset);
      reply.set_arena_placement(allocated->placement);
      spdlog::info("{} rank {}: arena allocated bytes={} placement={} path={} offset={}", role_name,
                   options.tp_rank, arena_bytes, allocated->placement, reply.arena_path(),
                   allocated->fd_offset);
    } else {
      spdlog::info("{} rank {}: arena of {} bytes attached", role_name, options.tp_rank,
                   arena_bytes);
    }
    return absl::OkStatus();
  }

  // Withdraws the arena from the data plane and lets it go (needs mu): after a refused attach,
  // and at Stop, where Deregister frees memory the transport allocated.
  void ReleaseArenaLocked() {
    if (region != 0) {
      const absl::Status released = transport->Deregister(region);
      if (!released.ok()) {
        spdlog::warn("{}: withdrawing the arena: {}", role_name, DescribeError(released));
      } else if (allocated && attached) {
        spdlog::info("{} rank {}: arena freed bytes={} placement={}", role_name, options.tp_rank,
                     allocated->length, allocated->placement);
      }
    }
    region = 0;
    allocated.reset();
    host_arena.reset();
    cuda_arena.reset();
    arena_base = 0;
    arena_bytes = 0;
    prefill.reset();
    decode.reset();
    attached = false;
  }

  absl::Status Ready(const v1::Ready& ready) {
    const std::string context = absl::StrCat("Ready room ", ready.room());
    if (options.role != Role::kPrefill) {
      return absl::FailedPreconditionError(context + ": this is a decode sidecar");
    }
    session::RoomReady room_ready;
    if (!ready.source_manifest().empty()) {
      absl::StatusOr<layout::Manifest> manifest = layout::ParseManifest(ready.source_manifest());
      if (!manifest.ok()) return AddContext(manifest.status(), context + ": source manifest");
      room_ready.source_manifest = *std::move(manifest);
    }
    room_ready.bootstrap_token = ready.bootstrap_token();
    if (ready.speculative_ids_size() > 0) {
      room_ready.spec_candidate_ids =
          std::vector<int32_t>(ready.speculative_ids().begin(), ready.speculative_ids().end());
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!attached) return absl::FailedPreconditionError(context + ": attach an arena first");
    const absl::Time now = absl::Now();
    absl::StatusOr<session::PrefillOutput> begun = prefill->BeginRoom(ready.room(), now);
    if (!begun.ok()) return AddContext(begun.status(), context);
    // BeginRoom reports the current state; only a terminal one is news to the engine.
    ApplyLocked(*std::move(begun));
    absl::StatusOr<session::PrefillOutput> out =
        prefill->Ready(ready.room(), std::move(room_ready), now);
    if (!out.ok()) return AddContext(out.status(), context);
    ApplyLocked(*std::move(out));
    return absl::OkStatus();
  }

  absl::Status Expect(const v1::Expect& expect) {
    const std::string context = absl::StrCat("Expect room ", expect.room());
    if (options.role != Role::kDecode) {
      return absl::FailedPreconditionError(context + ": this is a prefill sidecar");
    }
    absl::StatusOr<layout::Manifest> manifest =
        layout::ParseManifest(expect.destination_manifest());
    if (!manifest.ok()) return AddContext(manifest.status(), context + ": destination manifest");
    KVRAIL_RETURN_IF_ERROR(SplitHostPort(expect.bootstrap_address(), "bootstrap address").status());
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!attached) return absl::FailedPreconditionError(context + ": attach an arena first");
      KVRAIL_RETURN_IF_ERROR(AddContext(layout::ValidateManifest(*manifest, contract_copy),
                                        context + ": destination manifest"));
      absl::StatusOr<session::DecodeOutput> out =
          decode->BeginRoom(expect.room(), expect.bootstrap_address(), absl::Now());
      if (!out.ok()) return AddContext(out.status(), context);
      ApplyLocked(*std::move(out));
    }
    worker.Post([this, room = expect.room(), address = expect.bootstrap_address(),
                 manifest = *std::move(manifest)] { Route(room, address, manifest); });
    return absl::OkStatus();
  }

  layout::Contract contract_copy;
  const layout::Contract& DecodeContract() const { return contract_copy; }

  void Poll(const v1::Poll& poll, v1::EngineReply& reply) {
    std::lock_guard<std::mutex> lock(mu);
    for (uint64_t room : poll.rooms()) {
      v1::RoomState* state = reply.add_states();
      state->set_room(room);
      auto done = finished.find(room);
      std::optional<TransferPoll> current;
      if (done != finished.end()) {
        current = done->second.first;
        state->set_reason(done->second.second);
      } else if (prefill) {
        current = prefill->State(room);
      } else if (decode) {
        current = decode->State(room);
      }
      if (!current) {
        state->set_status(v1::TRANSFER_POLL_FAILED);
        state->set_reason("unknown room");
      } else {
        state->set_status(static_cast<v1::TransferPoll>(static_cast<int>(*current)));
      }
    }
  }

  absl::Status Abort(const v1::Abort& abort) {
    std::lock_guard<std::mutex> lock(mu);
    if (!attached) return absl::FailedPreconditionError("Abort: attach an arena first");
    const std::string reason = abort.reason().empty() ? "aborted by the engine" : abort.reason();
    if (prefill) {
      auto t = transfers.find(abort.room());
      if (t != transfers.end()) {
        for (uint64_t id : t->second.ids) (void)scheduler->Cancel(id, reason);
      }
      ApplyLocked(prefill->Abort(abort.room(), reason, absl::Now()));
    } else {
      ApplyLocked(decode->Fail(abort.room(), reason, absl::Now()));
    }
    return absl::OkStatus();
  }

  // --- decode: route a room (worker thread) ---------------------------------------------------

  absl::StatusOr<std::shared_ptr<PrefillNode>> NodeFor(const std::string& address) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = nodes.find(address);
      if (it != nodes.end()) return it->second;
    }
    KVRAIL_ASSIGN_OR_RETURN(auto server, SplitHostPort(address, "bootstrap address"));
    bootstrap::BootstrapClient client(server.first, server.second);
    KVRAIL_ASSIGN_OR_RETURN(plan::PrefillDescription description, client.Sync());
    auto node = std::make_shared<PrefillNode>();
    if (description.pp_size > 1) {
      KVRAIL_ASSIGN_OR_RETURN(
          plan::PipelineRoute route,
          plan::PlanPipelineRoute(description.pipeline, description.stage_tp_size, options.tp_size,
                                  options.tp_rank, description.contract, DecodeContract()));
      node->targets = std::move(route.targets);
    } else {
      KVRAIL_ASSIGN_OR_RETURN(plan::Planner planner,
                              plan::Planner::Create(description.stage_tp_size, options.tp_size,
                                                    description.contract, DecodeContract()));
      KVRAIL_ASSIGN_OR_RETURN(node->targets, planner.TargetsFor(options.tp_rank));
    }
    node->description = std::move(description);
    std::lock_guard<std::mutex> lock(mu);
    nodes[address] = node;
    return node;
  }

  absl::StatusOr<std::string> EndpointFor(const std::string& address, PrefillNode& node,
                                          int dp_group, int rank) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = node.endpoints.find({dp_group, rank});
      if (it != node.endpoints.end()) return it->second;
    }
    KVRAIL_ASSIGN_OR_RETURN(auto server, SplitHostPort(address, "bootstrap address"));
    bootstrap::BootstrapClient client(server.first, server.second);
    KVRAIL_ASSIGN_OR_RETURN(bootstrap::RankEndpoint endpoint, client.LookupRank(rank, dp_group));
    const std::string tcp = absl::StrCat("tcp://", endpoint.rank_ip, ":", endpoint.rank_port);
    std::lock_guard<std::mutex> lock(mu);
    node.endpoints[{dp_group, rank}] = tcp;
    return tcp;
  }

  void Route(uint64_t room, const std::string& address, const layout::Manifest& manifest) {
    auto routed = [&]() -> absl::StatusOr<session::RoomRoute> {
      KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<PrefillNode> node, NodeFor(address));
      session::RoomRoute route;
      route.dp_group = static_cast<int>(room % static_cast<uint64_t>(node->description.dp_size));
      route.targets = node->targets;
      for (int rank : route.targets.target_tp_ranks) {
        KVRAIL_ASSIGN_OR_RETURN(std::string endpoint,
                                EndpointFor(address, *node, route.dp_group, rank));
        route.endpoints.push_back({rank, endpoint});
      }
      return route;
    }();
    std::lock_guard<std::mutex> lock(mu);
    const absl::Time now = absl::Now();
    if (!routed.ok()) {
      ApplyLocked(decode->Fail(
          room, absl::StrCat("route to ", address, ": ", DescribeError(routed.status())), now));
      return;
    }
    absl::StatusOr<session::DecodeOutput> out = decode->OnRoute(room, *std::move(routed), now);
    if (!out.ok()) {
      ApplyLocked(decode->Fail(room, DescribeError(out.status()), now));
      return;
    }
    ApplyLocked(*std::move(out));
    out = decode->OnAllocated(room, manifest, now);
    if (!out.ok()) {
      ApplyLocked(decode->Fail(room, DescribeError(out.status()), now));
      return;
    }
    ApplyLocked(*std::move(out));
  }

  // --- prefill: move a room (worker thread) -----------------------------------------------------

  void StartTransfer(session::TransferWork work) {
    const uint64_t room = work.room;
    struct Prepared {
      transfer::RoomTransfer request;
      std::string session;
    };
    std::vector<Prepared> prepared;
    std::string failed_session;
    absl::Status error;
    uint64_t copies_total = 0;
    for (const session::TransferDestination& destination : work.destinations) {
      const session::DecodePeer& peer = *destination.peer;
      if (peer.dummy || peer.copy_plan == nullptr) continue;
      const std::string& session = peer.registration.session_id;
      absl::StatusOr<transfer::PeerLink> link = directory->Get(session);
      if (!link.ok()) {
        error = link.status();
        failed_session = session;
        break;
      }
      Prepared p;
      p.session = session;
      p.request.peer = link->peer;
      p.request.source = region;
      p.request.source_length = arena_bytes;
      p.request.remote = link->regions;
      p.request.remote_base = peer.registration.arena_base;  // B_dst, frame 4 (CACHEPD §6.9)
      const absl::Status expanded = peer.copy_plan->ExpandCoalesced(
          *work.source_manifest, *destination.manifest, p.request.copies);
      if (!expanded.ok()) {
        error = expanded;
        failed_session = session;
        break;
      }
      copies_total += p.request.copies.size();
      p.request.deadline = absl::Now() + options.transfer_deadline;
      prepared.push_back(std::move(p));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!error.ok()) {
      ApplyLocked(
          prefill->OnTransferFailed(room, failed_session, DescribeError(error), absl::Now()));
      return;
    }
    RoomTransfers& state = transfers[room];
    state.started = absl::Now();
    state.copies = copies_total;
    state.bytes = work.total_bytes;
    if (prepared.empty()) {
      transfers.erase(room);
      absl::StatusOr<session::PrefillOutput> out = prefill->OnTransferDone(room, absl::Now());
      if (out.ok()) ApplyLocked(*std::move(out));
      return;
    }
    for (Prepared& p : prepared) {
      const uint64_t id = next_transfer_id++;
      p.request.transfer_id = id;
      p.request.done = [this](const transfer::RoomOutcome& outcome) { OnTransfer(outcome); };
      transfer_owner[id] = {room, p.session};
      state.ids.push_back(id);
      ++state.pending;
      absl::Status submitted = scheduler->Submit(std::move(p.request));
      if (!submitted.ok()) {
        transfer_owner.erase(id);
        --state.pending;
        for (uint64_t other : state.ids) (void)scheduler->Cancel(other, "a sibling was rejected");
        state.failed = true;
        ApplyLocked(
            prefill->OnTransferFailed(room, p.session, DescribeError(submitted), absl::Now()));
        if (state.pending == 0) transfers.erase(room);
        return;
      }
    }
  }

  void OnTransfer(const transfer::RoomOutcome& outcome) {
    std::lock_guard<std::mutex> lock(mu);
    auto owner = transfer_owner.find(outcome.transfer_id);
    if (owner == transfer_owner.end()) return;
    const TransferOwner who = owner->second;
    transfer_owner.erase(owner);
    auto it = transfers.find(who.room);
    if (it == transfers.end()) return;
    RoomTransfers& state = it->second;
    --state.pending;
    if (!outcome.status.ok() && !state.failed) {
      state.failed = true;
      for (uint64_t other : state.ids) {
        if (other != outcome.transfer_id) (void)scheduler->Cancel(other, "a sibling failed");
      }
      if (outcome.status.code() == absl::StatusCode::kUnavailable) {
        directory->Drop(who.session);  // reconnect afresh next time
      }
      ApplyLocked(
          prefill->OnTransferFailed(who.room, who.session, outcome.status.ToString(), absl::Now()));
    }
    if (state.pending > 0) return;
    const bool failed = state.failed;
    if (!failed) {
      stats.bytes_sent += state.bytes;
      absl::StatusOr<session::PrefillOutput> out = prefill->OnTransferDone(who.room, absl::Now());
      if (out.ok()) ApplyLocked(*std::move(out));
    }
    transfers.erase(who.room);
  }

  // --- loops --------------------------------------------------------------------------------

  void InboxLoop() {
    while (!stop.load()) {
      absl::StatusOr<std::optional<std::vector<std::string>>> message =
          inbox->Receive(absl::Milliseconds(100));
      if (!message.ok()) {
        if (message.status().code() == absl::StatusCode::kInvalidArgument) {
          std::lock_guard<std::mutex> lock(mu);
          ++stats.peer_messages_rejected;
          spdlog::warn("{}: peer message dropped: {}", role_name,
                       std::string(message.status().message()));
          continue;
        }
        return;
      }
      if (!message->has_value()) continue;
      std::lock_guard<std::mutex> lock(mu);
      ++stats.peer_messages;
      if (!attached) {
        ++stats.peer_messages_rejected;
        spdlog::warn("{}: peer message before the engine attached its arena: dropped", role_name);
        continue;
      }
      const absl::Time now = absl::Now();
      absl::Status rejected;
      if (prefill) {
        session::PrefillOutput out = prefill->OnMessage(**message, now);
        rejected = out.rejected;
        ApplyLocked(std::move(out));
      } else {
        session::DecodeOutput out = decode->OnMessage(**message, now);
        rejected = out.rejected;
        ApplyLocked(std::move(out));
      }
      if (!rejected.ok()) {
        ++stats.peer_messages_rejected;
        spdlog::warn("{}: peer message refused: {}", role_name, DescribeError(rejected));
      }
    }
  }

  void TickerLoop() {
    absl::Time next_heartbeat = absl::Now();
    const absl::Duration interval = session::EffectiveHeartbeatInterval(options.timeouts);
    while (!stop.load()) {
      absl::SleepFor(absl::Milliseconds(50));
      std::vector<std::string> probe;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!attached) continue;
        const absl::Time now = absl::Now();
        if (prefill) {
          ApplyLocked(prefill->Tick(now));
        } else {
          ApplyLocked(decode->Tick(now));
          if (now >= next_heartbeat) {
            probe = decode->BootstrapAddresses();
            next_heartbeat = now + interval;
          }
        }
      }
      for (const std::string& address : probe) {  // HTTP, so outside the lock
        absl::StatusOr<std::pair<std::string, int>> server = SplitHostPort(address, "bootstrap");
        bootstrap::BootstrapClientOptions quick;
        quick.retries = 0;
        quick.connect_timeout = std::chrono::milliseconds(500);
        quick.read_timeout = std::chrono::milliseconds(1000);
        quick.deadline = std::chrono::milliseconds(1500);
        const bool ok =
            server.ok() &&
            bootstrap::BootstrapClient(server->first, server->second, quick).Health().ok();
        std::lock_guard<std::mutex> lock(mu);
        ApplyLocked(decode->OnHealth(address, ok, absl::Now()));
      }
    }
  }
};

Sidecar::Sidecar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Sidecar>> Sidecar::Start(const SidecarOptions& options) {
  if (options.tp_size < 1 || options.tp_rank < 0 || options.tp_rank >= options.tp_size) {
    return absl::InvalidArgumentError(absl::StrFormat("--tp-rank %d must lie in [0, --tp-size %d)",
                                                      options.tp_rank, options.tp_size));
  }
  if (options.dp_size < 1 || options.dp_rank < 0 || options.dp_rank >= options.dp_size) {
    return absl::InvalidArgumentError(absl::StrFormat("--dp-rank %d must lie in [0, --dp-size %d)",
                                                      options.dp_rank, options.dp_size));
  }
  if (options.pp_size < 1 || options.pp_rank < 0 || options.pp_rank >= options.pp_size) {
    return absl::InvalidArgumentError(absl::StrFormat("--pp-rank %d must lie in [0, --pp-size %d)",
                                                      options.pp_rank, options.pp_size));
  }
  if (options.role == Role::kPrefill) {
    KVRAIL_RETURN_IF_ERROR(SplitHostPort(options.bootstrap, "--bootstrap").status());
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->role_name = options.role == Role::kPrefill ? "prefill" : "decode";
  impl->zmq = session::ZmqContext::Create();
  KVRAIL_ASSIGN_OR_RETURN(impl->inbox, session::ZmqInbox::Bind(impl->zmq, options.host, 0));
  // Deep queues: at 1000 rooms in flight the default 1000 messages per peer overflowed
  // (bench/control).
  session::OutboxOptions outbox_options;
  outbox_options.send_hwm = 100000;
  impl->outbox = std::make_unique<session::ZmqOutbox>(impl->zmq, outbox_options);
  transport::TransportSpec spec;
  spec.lanes = options.lanes;
  spec.tls = options.tls;
  spec.net_devices = options.net_devices;
  KVRAIL_ASSIGN_OR_RETURN(impl->transport, transport::MakeTransport(spec));
  if (options.role == Role::kDecode) {
    transport::Transport* t = impl->transport.get();
    KVRAIL_ASSIGN_OR_RETURN(
        impl->handshake,
        transport::HandshakeServer::Start(options.host, 0, [t] { return t->LocalDescriptor(); }));
    impl->session_id = impl->handshake->session_id();
  } else {
    impl->descriptors = std::make_unique<transport::DescriptorCache>(absl::Seconds(5));
    impl->directory =
        std::make_unique<transfer::PeerDirectory>(impl->transport.get(), impl->descriptors.get());
    impl->scheduler = std::make_unique<transfer::Scheduler>(impl->transport.get());
  }
  Impl* raw = impl.get();
  KVRAIL_ASSIGN_OR_RETURN(
      impl->api, engine_api::EngineApiServer::Start(
                     options.engine_endpoint,
                     [raw](const v1::EngineRequest& request) { return raw->Handle(request); }));
  impl->inbox_thread = std::thread([raw] { raw->InboxLoop(); });
  impl->ticker_thread = std::thread([raw] { raw->TickerLoop(); });
  spdlog::info(
      "{} sidecar rank {}/{}: engine API {}, CachePD {}{}", impl->role_name, options.tp_rank,
      options.tp_size, impl->api->endpoint(), impl->inbox->endpoint(),
      impl->session_id.empty() ? "" : absl::StrCat(", data-plane session ", impl->session_id));
  return std::unique_ptr<Sidecar>(new Sidecar(std::move(impl)));
}

Sidecar::~Sidecar() { Stop(); }

void Sidecar::Stop() {
  Impl& impl = *impl_;
  if (impl.stop.exchange(true)) return;
  impl.api->Stop();
  if (impl.inbox_thread.joinable()) impl.inbox_thread.join();
  if (impl.ticker_thread.joinable()) impl.ticker_thread.join();
  impl.worker.Stop();
  impl.scheduler.reset();  // cancels transfers in flight; their outcomes find the rooms gone
  if (impl.handshake) impl.handshake->Stop();
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    impl.ReleaseArenaLocked();
  }
  impl.transport->Close();
  impl.inbox->Close();
}

const std::string& Sidecar::engine_endpoint() const { return impl_->api->endpoint(); }
const std::string& Sidecar::cachepd_endpoint() const { return impl_->inbox->endpoint(); }
const std::string& Sidecar::session_id() const { return impl_->session_id; }

SidecarStats Sidecar::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace kvrail::sidecar
