// What both roles' sidecars share: start and stop, the engine API dispatch, Poll, Stats, and the
// outputs (events, page releases, CachePD sends). The other seams: sidecar_core.h.
#include "control/sidecar/sidecar_core.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "control/session/ended_room.h"
#include "control/sidecar/advertise_host.h"
#include "control/wire/digest.h"
#include "control/wire/outcome.h"
#include "control/wire/proof.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"
#include "engine/base/error.h"
#include "engine/sync/thread_name.h"
#include "engine/transport/factory.h"

namespace kvrail::sidecar {

using session::TransferPoll;

namespace {

bool Terminal(TransferPoll state) {
  return state == TransferPoll::kSuccess || state == TransferPoll::kFailed;
}

}  // namespace

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

void SidecarCore::RunDeferredOffOwner() {
  if (deferred.empty()) return;
  std::vector<std::function<void()>> work;
  work.swap(deferred);
  effects.Post("effects", [work = std::move(work)] {
    for (const std::function<void()>& call : work) call();
  });
}

void SidecarCore::PostOwned(std::function<void()> fn) {
  // What the job defers waits in `deferred` until the owner has run every job it took in this
  // wake: then one post to `effects` carries them all, in order (the driver's `run`).
  owner.Post(std::move(fn));
}

// --- outputs --------------------------------------------------------------------------------

void SidecarCore::Publish(const session::RoomEvent& event) {
  AssertOnOwner("Publish");
  if (!Terminal(event.state)) {
    // A prefill room the engine began with Begin: its Bootstrapped is news, once.
    if (event.state == TransferPoll::kBootstrapped && event.announce) {
      v1::RoomEvent out;
      out.set_room(event.room);
      out.set_status(v1::TRANSFER_POLL_BOOTSTRAPPED);
      out.set_bootstrap_token(-1);
      for (const session::DecodeWindow& window : event.windows) {
        v1::DecodeWindow* w = out.add_windows();
        w->set_session(window.session_id);
        w->set_decode_tp_rank(window.decode_tp_rank);
        w->set_prefix_len(window.prefix_len);
        w->set_prompt_len(window.prompt_len);
      }
      api->Publish(out);
    }
    return;
  }
  v1::RoomEvent out;
  out.set_room(event.room);
  out.set_status(static_cast<v1::TransferPoll>(static_cast<int>(event.state)));
  out.set_reason(event.reason);
  out.set_cause(std::string(session::FailureCauseLabel(event.cause)));
  out.set_bootstrap_token(event.bootstrap_token);
  if (event.spec_candidate_ids) {
    for (int32_t id : *event.spec_candidate_ids) out.add_speculative_ids(id);
  }
  out.set_cached_tokens(event.cached_tokens);  // decode Success (CACHEPD §12.9); 0 otherwise
  if (event.bootstrap_logprob) out.set_first_token_logprob(*event.bootstrap_logprob);
  // What landed: a prefill's bytes written (0 unless Success), copies posted and seconds from
  // its first work; a decode's, as the prefill ranks told it, from the pre-allocations on.
  out.set_bytes(event.bytes);
  out.set_copies(event.copies);
  out.set_seconds(absl::ToDoubleSeconds(event.elapsed));
  // A prefill room ends only once fenced (PrefillRooms' TransferPhase); a decode room says.
  switch (event.pages) {
    case session::Pages::kHeld:
      out.set_pages(v1::PAGES_HELD);
      break;
    case session::Pages::kReusable:
    case session::Pages::kUnspecified:
      out.set_pages(v1::PAGES_REUSABLE);
      break;
  }
  api->Publish(out);
}

void SidecarCore::PublishRelease(const session::PagesRelease& release) {
  AssertOnOwner("PublishRelease");
  v1::RoomEvent out;
  out.set_room(release.room);
  out.set_status(v1::TRANSFER_POLL_PAGES_RELEASED);  // a notice, not a second Failed
  out.set_reason(release.reason);
  out.set_pages(v1::PAGES_REUSABLE);
  out.set_pages_released(true);
  out.set_pages_proven(release.proven);
  out.set_fence_seconds(absl::ToDoubleSeconds(release.waited));
  metrics.FenceObserved(release.waited);
  if (release.proven) {
    spdlog::info("decode room {} pages released: fenced by every prefill rank in {}", release.room,
                 absl::FormatDuration(release.waited));
  } else {
    ++stats.pages_unproven;
    spdlog::warn("decode room {} pages released unproven: {}", release.room, release.reason);
  }
  api->Publish(out);
}

void SidecarCore::FinishLocked(const session::RoomEvent& event) {
  AssertOnOwner("FinishLocked");
  if (!Terminal(event.state)) {
    metrics.RoomSeen(event.room, absl::Now());  // its clock starts at its first event
    return;
  }
  metrics.RoomEnded(event.room, event.state == TransferPoll::kSuccess, event.cause, event.reason,
                    absl::Now());
  if (event.state == TransferPoll::kSuccess) {
    ++stats.rooms_succeeded;
  } else {
    ++stats.rooms_failed;
    spdlog::warn("{} room {} failed: {}", role_name, event.room, event.reason);
  }
  FreeLocked(event.room);
}

std::vector<std::pair<uint64_t, std::string>> SidecarCore::SendLocked(
    const std::vector<session::OutboundMessage>& messages) {
  AssertOnOwner("SendLocked");
  std::vector<std::pair<uint64_t, std::string>> lost;
  for (const session::OutboundMessage& m : messages) {
    if (!PrepareSendLocked(m)) continue;
    const absl::Status sent = outbox->Send(m.endpoint, m.frames);
    if (sent.ok()) continue;
    spdlog::warn("{}: sending to {} failed: {}", role_name, m.endpoint,
                 std::string(sent.message()));
    uint64_t room = 0;
    if (!m.frames.empty() && absl::SimpleAtoi(m.frames[0], &room)) {
      lost.emplace_back(room, absl::StrCat("sending to ", m.endpoint, " failed: ", sent.message()));
    }
  }
  return lost;
}

// --- engine API -----------------------------------------------------------------------------

v1::EngineReply SidecarCore::Handle(const v1::EngineRequest& request) {
  v1::EngineReply reply;
  absl::Status status;
  switch (request.kind_case()) {
    case v1::EngineRequest::kAttach:
      status = Attach(request.attach(), reply);
      break;
    case v1::EngineRequest::kReady:
      status = Ready(request.ready());
      break;
    case v1::EngineRequest::kLayersReady:
      status = LayersReady(request.layers_ready());
      break;
    case v1::EngineRequest::kBegin:
      status = Begin(request.begin());
      break;
    case v1::EngineRequest::kExpect:
      status = Expect(request.expect());
      break;
    case v1::EngineRequest::kPoll:
      Poll(request.poll(), reply);
      break;
    case v1::EngineRequest::kStats: {
      const SidecarStats s = Stats();
      v1::SidecarStats* out = reply.mutable_stats();
      out->set_rooms_succeeded(s.rooms_succeeded);
      out->set_rooms_failed(s.rooms_failed);
      out->set_peer_messages(s.peer_messages);
      out->set_peer_messages_rejected(s.peer_messages_rejected);
      out->set_bytes_sent(s.bytes_sent);
      out->set_pages_unproven(s.pages_unproven);
      out->set_bootstrap_registrations(s.bootstrap_registrations);
      out->set_rooms(s.rooms);
      out->set_registrations(s.registrations);
      out->set_fences(s.fences);
      out->set_transfers(s.transfers);
      out->set_finished_remembered(s.finished_remembered);
      out->set_failed_rooms_remembered(s.failed_rooms_remembered);
      out->set_outbox_peers(s.outbox_peers);
      out->set_data_plane_peers(s.data_plane_peers);
      out->set_scheduler_transfers(s.scheduler_transfers);
      out->set_scheduler_peers(s.scheduler_peers);
      out->set_strands(s.strands);
      out->set_engines(s.engines);
      out->set_registrations_refused(s.registrations_refused);
      out->set_registrations_held(s.registrations_held);
      out->set_room_digests(s.room_digests);
      out->set_room_digests_failed(s.room_digests_failed);
      out->set_rail_failovers(s.rail_failovers);
      out->set_endpoints(s.endpoints);
      out->set_regions(s.regions);
      out->set_role(role_name);
      out->set_tp_rank(options.tp_rank);
      out->set_tp_size(options.tp_size);
      out->set_pid(getpid());
      out->set_arena_bytes(s.arena_bytes);
      out->set_layers(s.layers);
      break;
    }
    case v1::EngineRequest::kAbort: {
      const std::string reason =
          request.abort().reason().empty() ? "aborted by the engine" : request.abort().reason();
      status = Owned([&]() -> absl::Status {
        if (!attached) return absl::FailedPreconditionError("Abort: attach an arena first");
        AbortLocked(request.abort().room(), reason);
        return absl::OkStatus();
      });
      break;
    }
    default:
      status = absl::InvalidArgumentError("unknown request");
  }
  if (!status.ok()) reply.set_error(DescribeError(status));
  return reply;
}

bool SidecarCore::TakeSlow(const v1::EngineRequest& request,
                           const engine_api::EngineApiServer::Responder& respond) {
  // About a thousand blocks: parsed inline in well under a millisecond. A million-block
  // manifest takes about a second to parse and check.
  constexpr size_t kInlineManifestBytes = 64 << 10;
  size_t manifest_bytes = 0;
  std::optional<uint64_t> room;
  switch (request.kind_case()) {
    case v1::EngineRequest::kReady:
      // A manifest's JSON, or its block tables: either is parsed and checked a byte at a time.
      manifest_bytes =
          request.ready().source_manifest().size() +
          (request.ready().block_tables_size() > 0 ? request.ready().ByteSizeLong() : 0);
      room = request.ready().room();
      break;
    case v1::EngineRequest::kLayersReady:
      manifest_bytes = request.layers_ready().source_manifest().size();
      room = request.layers_ready().room();
      break;
    case v1::EngineRequest::kExpect:
      manifest_bytes =
          request.expect().destination_manifest().size() +
          (request.expect().block_tables_size() > 0 ? request.expect().ByteSizeLong() : 0);
      room = request.expect().room();
      break;
    case v1::EngineRequest::kAbort:
      room = request.abort().room();
      break;
    case v1::EngineRequest::kBegin:
      room = request.begin().room();
      break;
    default:
      return false;  // Attach and Stats: answered on the engine API's thread
  }
  {
    MutexLock lock(&deferred_mu);
    const bool behind = deferred_rooms.count(*room) > 0;  // earlier requests of it wait there
    if (manifest_bytes < kInlineManifestBytes && !behind) {
      return false;  // applied by the handler, on the engine API's thread: the owner
    }
    ++deferred_rooms[*room];
  }
  parser.Post("manifests", [this, request, respond, room = *room] {
    respond(Handle(request));
    MutexLock lock(&deferred_mu);
    if (--deferred_rooms[room] == 0) deferred_rooms.erase(room);
  });
  return true;
}

absl::Status SidecarCore::Ready(const v1::Ready& ready) {
  return absl::FailedPreconditionError(
      absl::StrCat("Ready room ", ready.room(), ": this is a ", role_name, " sidecar"));
}

absl::Status SidecarCore::LayersReady(const v1::LayersReady& layers) {
  return absl::FailedPreconditionError(
      absl::StrCat("LayersReady room ", layers.room(), ": this is a ", role_name, " sidecar"));
}

absl::Status SidecarCore::Begin(const v1::Begin& begin) {
  return absl::FailedPreconditionError(
      absl::StrCat("Begin room ", begin.room(), ": this is a ", role_name, " sidecar"));
}

absl::Status SidecarCore::Expect(const v1::Expect& expect) {
  return absl::FailedPreconditionError(
      absl::StrCat("Expect room ", expect.room(), ": this is a ", role_name, " sidecar"));
}

absl::StatusOr<layout::Manifest> SidecarCore::ManifestFromTables(
    const google::protobuf::RepeatedPtrField<v1::BlockTable>& tables, int64_t prefix_len,
    int64_t prompt_len, const std::string& context) const {
  std::vector<std::vector<int64_t>> block_tables;
  block_tables.reserve(tables.size());
  for (const v1::BlockTable& table : tables) {
    block_tables.emplace_back(table.block_ids().begin(), table.block_ids().end());
  }
  absl::StatusOr<layout::Manifest> built =
      layout::BuildManifest(contract, block_tables, prefix_len, prompt_len);
  if (!built.ok()) return AddContext(built.status(), context);
  return built;
}

void SidecarCore::Poll(const v1::Poll& poll, v1::EngineReply& reply) {
  Owned([&] { PollLocked(poll, reply); });
}

void SidecarCore::PollLocked(const v1::Poll& poll, v1::EngineReply& reply) {
  AssertOnOwner("PollLocked");
  for (uint64_t room : poll.rooms()) {
    v1::RoomState* state = reply.add_states();
    state->set_room(room);
    state->set_bootstrap_token(-1);
    // A room that ended: its one terminal event, as its ledger remembers it.
    const session::EndedRoom* ended = EndedLocked(room);
    std::optional<TransferPoll> current;
    if (ended != nullptr) {
      current = ended->state;
      state->set_reason(ended->reason);
      state->set_cause(std::string(session::FailureCauseLabel(ended->cause)));
      state->set_bootstrap_token(ended->bootstrap_token);
      for (int32_t id : ended->speculative_ids) state->add_speculative_ids(id);
      state->set_cached_tokens(ended->cached_tokens);
      if (ended->first_token_logprob) state->set_first_token_logprob(*ended->first_token_logprob);
    } else if (attached) {
      current = RoomStateLocked(room, *state);
    }
    if (!current) {
      state->set_status(v1::TRANSFER_POLL_FAILED);
      state->set_reason("unknown room");
    } else {
      state->set_status(static_cast<v1::TransferPoll>(static_cast<int>(*current)));
    }
  }
}

// --- start and stop -------------------------------------------------------------------------

// --- start and stop -------------------------------------------------------------------------

SidecarCore::SidecarCore(const SidecarOptions& options, const char* role_name)
    : options(options), role_name(role_name) {}

absl::Status SidecarCore::CheckOwnKey() const {
  const zmq_auth::KeyIdentity& own = options.curve->own.identity;
  if (own.role != KeyRole() || own.rank != KeyRank() || options.curve->own.secret_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--curve-key holds the key of ", zmq_auth::UserId(own), ", but this sidecar is ",
        zmq_auth::RoleName(KeyRole()), " rank ", KeyRank(), " (", KeyRankRule(), ")"));
  }
  if (options.curve->allowed == nullptr) {
    return absl::InvalidArgumentError("--curve-key needs --curve-allowed");
  }
  return absl::OkStatus();
}

zmq_auth::ZapOptions SidecarCore::ZapFor(zmq_auth::KeyRole role, int rank,
                                         const std::string& socket) const {
  zmq_auth::ZapOptions zap;
  zap.allowed = options.curve->allowed;
  zap.admit = [role, rank, socket](const zmq_auth::KeyIdentity& key) {
    if (key.role == role && (rank < 0 || key.rank == rank)) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("the ", socket, " takes only ", zmq_auth::RoleName(role), " keys",
                     rank < 0 ? std::string() : absl::StrCat(" of rank ", rank)));
  };
  zap.on_refusal = options.on_auth_refusal;
  if (!zap.on_refusal) {
    zap.on_refusal = [socket](const std::string& address, const std::string& reason) {
      spdlog::warn("event=curve_refused socket={} peer={} reason=\"{}\"", socket, address, reason);
    };
  }
  return zap;
}

absl::Status SidecarCore::Start() {
  KVRAIL_RETURN_IF_ERROR(CheckOptions());
  KVRAIL_ASSIGN_OR_RETURN(const std::vector<std::string> host_addresses, HostAddresses());
  KVRAIL_ASSIGN_OR_RETURN(
      options.advertise_host,
      ChooseAdvertiseHost(options.host, options.advertise_host, host_addresses));
  const std::string advertise = options.advertise_host;
  const bool curve = options.curve != nullptr;
  session::InboxOptions inbox_options;
  inbox_options.on_connection_cut = [this](const std::string& peer, const std::string& why) {
    connections_cut.fetch_add(1);
    // Keyed by host (a reconnect changes the port), apart from the host's message refusals,
    // so that neither kind of line hides the other.
    const std::string host = peer.substr(0, peer.rfind(':')) + " (connections)";
    const session::PeerLogLimiter::Verdict verdict =
        peer_log.Admit(host, session::PeerLogLimiter::Clock::now());
    if (!verdict.log) return;
    spdlog::warn("{}: CachePD connection from {} {}; nothing of it was taken{}", role_name, peer,
                 why,
                 verdict.held_back == 0 ? ""
                                        : absl::StrCat(" (", verdict.held_back, " more from ", host,
                                                       " held back in the last 10 s)"));
  };
  // Deep queues: at 1000 rooms in flight the default 1000 messages per peer overflowed
  // (bench/control).
  session::OutboxOptions outbox_options;
  outbox_options.send_hwm = 100000;
  outbox_options.intercept = options.intercept_message;
  if (curve) {
    KVRAIL_RETURN_IF_ERROR(CheckOwnKey());
    // A prefill's CachePD socket hears decodes; a decode's hears prefills.
    KVRAIL_ASSIGN_OR_RETURN(
        zmq, session::ZmqContext::CreateWithZap(ZapFor(PeerKeyRole(), -1, "CachePD socket")));
    auto own = std::make_shared<const zmq_auth::KeyFile>(options.curve->own);
    inbox_options.curve_server = own;
    outbox_options.curve_client = own;
  } else {
    zmq = session::ZmqContext::Create();
  }
  KVRAIL_ASSIGN_OR_RETURN(inbox, session::ZmqInbox::Bind(zmq, options.host, 0, inbox_options));
  // Before anyone is told the address: one nobody reaches fails rooms far from the cause.
  KVRAIL_RETURN_IF_ERROR(
      CheckAdvertiseHost(advertise, options.host, inbox->port(), host_addresses, absl::Seconds(1)));
  cachepd_advertised = wire::ReplyEndpoint(advertise, inbox->port());
  outbox = std::make_unique<session::ZmqOutbox>(zmq, outbox_options);
  transport::TransportSpec spec;
  spec.backend = options.backend;
  spec.lanes = options.lanes;
  if (options.backend == "ucx") {
    spec.tls = options.tls;
    spec.net_devices = options.net_devices;
  }
  spec.verbs_provider = options.verbs_provider;
  spec.rdma_devices = options.rdma_devices;
  spec.gid_index = options.gid_index;
  spec.rail_affinity = options.rail_affinity;
  spec.connect_timeout = options.connect_timeout;
  spec.landing_stores = options.landing_stores;
  // As the peers name this rank (what a prefill registers with its bootstrap server), so that a
  // decode that finds it gone may refuse what it sent (DecodeSidecar::ProbePeers).
  spec.writer_name = wire::RankEndpoint(advertise, inbox->port());
  KVRAIL_ASSIGN_OR_RETURN(transport, transport::MakeTransport(spec));
  if (options.wrap_transport) transport = options.wrap_transport(std::move(transport));
  KVRAIL_RETURN_IF_ERROR(StartDataPlane());
  KVRAIL_RETURN_IF_ERROR(StartRegistry());  // --registry (registry_hooks.cc)
  SidecarCore* raw = this;
  // An ipc socket is its owner's alone already (0600): CURVE guards the engine API on tcp.
  std::optional<zmq_auth::CurveServerKeys> api_curve;
  if (curve && absl::StartsWith(options.engine_endpoint, "tcp://")) {
    api_curve = zmq_auth::CurveServerKeys{
        options.curve->own, ZapFor(zmq_auth::KeyRole::kEngine, KeyRank(), "engine API")};
  }
  // The engine API's thread owns the room state: between requests it runs what others posted
  // to the owner (owner_loop.h, Driven), then posts what those jobs deferred to `effects`.
  engine_api::ServerLoop owner_loop;
  owner_loop.fd = raw->owner.wake_fd();
  owner_loop.adopt = [raw] { raw->owner.Adopt(); };
  owner_loop.run = [raw] {
    raw->owner.RunPending();
    raw->RunDeferredOffOwner();
  };
  owner_loop.socket = inbox->poll_handle();
  owner_loop.read = [raw] {
    raw->WaitForApi();
    raw->ReadInboxLocked();
    raw->RunDeferredOffOwner();
  };
  auto handle = [raw](const v1::EngineRequest& request) {
    raw->WaitForApi();
    v1::EngineReply reply = raw->Handle(request);
    raw->RunDeferredOffOwner();
    return reply;
  };
  auto take_slow = [raw](const v1::EngineRequest& request,
                         const engine_api::EngineApiServer::Responder& respond) {
    raw->WaitForApi();
    return raw->TakeSlow(request, respond);
  };
  KVRAIL_ASSIGN_OR_RETURN(api, engine_api::EngineApiServer::Start(
                                   options.engine_endpoint, std::move(handle), std::move(take_slow),
                                   std::move(api_curve), std::move(owner_loop)));
  {
    MutexLock lock(&api_mu);
    api_ready = true;
  }
  api_assigned.notify_all();
  metrics.SetInfo(role_name, options.tp_rank,
                  session_id.empty() ? std::string(absl::StripPrefix(cachepd_advertised, "tcp://"))
                                     : session_id);
  metrics.SetStatsSource([raw] { return raw->Stats(); });
  ticker_thread = std::thread([raw] { raw->TickerLoop(); });
  NameThread(ticker_thread, "kvrail-ticker");
  spdlog::info(
      "{} sidecar rank {}/{}: engine API {}, CachePD {}{}{}{}", role_name, options.tp_rank,
      options.tp_size, api->endpoint(), inbox->endpoint(),
      cachepd_advertised == inbox->endpoint()
          ? ""
          : absl::StrCat(" (advertised as ", cachepd_advertised, ")"),
      session_id.empty() ? "" : absl::StrCat(", data-plane session ", session_id),
      curve ? absl::StrCat(", CURVE as ", zmq_auth::UserId(options.curve->own.identity)) : "");
  return absl::OkStatus();
}

void SidecarCore::Stop() {
  if (stop.exchange(true)) return;
  StopRegistry();  // a decode's entry goes first: its prefills drop it at once
  // The engine API's thread owns the room state (owner_loop.h, Driven): it takes no more
  // requests, and runs the owner's jobs until everything below is done.
  api->StopServing();
  parser.Stop();  // what it still holds is applied; its answers are dropped
  if (ticker_thread.joinable()) ticker_thread.join();
  strands.Stop();
  // From here only the data plane's completions post to the owner. What jobs posted before
  // deferred runs now; what they defer from here on is dropped (the scheduler fences all).
  owner.Call([this] { RunDeferredOffOwner(); });
  effects.Stop();
  // Fences what is in flight by disconnecting its peers; the outcomes find the rooms and
  // report them Failed to decode ranks still listening.
  StopDataPlane();
  {
    MutexLock attach_lock(&attach_mu);
    ReleaseArena();
  }
  transport->Close();
  owner.Stop();  // later posts are dropped
  api->Stop();   // its thread runs the outcomes' jobs still queued, then ends
  inbox->Close();
}

SidecarStats SidecarCore::Stats() {
  SidecarStats out;
  Owned([&] {
    out = stats;
    out.peer_messages_rejected += connections_cut.load();
    if (attached) LedgerStatsLocked(out);
    if (attached) {  // written before `attached` was set, read-only while it is
      out.arena_bytes = arena_bytes;
      out.layers = contract_layers;
    }
  });
  // Each of these has a lock of its own.
  out.outbox_peers = outbox->peer_count();
  DataPlaneStats(out);  // before `endpoints`, which counts the data-plane peers
  if (transport) {
    const transport::TransportCounters counters = transport->transport_counters();
    out.rail_failovers = counters.rail_failovers;
    out.lane_wakes_by_event = counters.lane_wakes_by_event;
    out.lane_wakes_by_job = counters.lane_wakes_by_job;
    out.lane_naps_ended = counters.lane_naps_ended;
    out.writes_stored_together = counters.writes_stored_together;
    // Every backend opens one endpoint (QP) per lane to each peer it connects.
    out.endpoints = out.data_plane_peers * static_cast<uint64_t>(transport->capabilities().lanes);
    // The transport's own list (under its lock), not the sidecar's bookkeeping of its arena.
    absl::StatusOr<v1::HandshakeDescriptor> local = transport->LocalDescriptor();
    if (local.ok()) out.regions = static_cast<uint64_t>(local->regions_size());
  }
  out.strands = strands.strands();
  if (api) out.engines = api->engines();
  return out;
}

}  // namespace kvrail::sidecar
