// Start and stop, the engine API dispatch, and how the state machines' outputs are applied.
// The other seams: sidecar_impl.h.
#include "control/sidecar/sidecar.h"

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
#include "control/sidecar/sidecar_impl.h"
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

// The rank a sidecar's own key must carry (zmq_auth::KeyIdentity): what its frames carry.
int KeyRank(const SidecarOptions& options) {
  return options.role == Role::kPrefill
             ? options.pp_rank * options.tp_size + options.tp_rank  // the status rank
             : options.tp_rank;                                     // frame 7
}

absl::Status CheckOwnKey(const SidecarOptions& options) {
  const zmq_auth::KeyIdentity& own = options.curve->own.identity;
  const zmq_auth::KeyRole role =
      options.role == Role::kPrefill ? zmq_auth::KeyRole::kPrefill : zmq_auth::KeyRole::kDecode;
  if (own.role != role || own.rank != KeyRank(options) || options.curve->own.secret_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--curve-key holds the key of ", zmq_auth::UserId(own), ", but this sidecar is ",
        zmq_auth::RoleName(role), " rank ", KeyRank(options),
        options.role == Role::kPrefill ? " (pp_rank * tp_size + tp_rank)" : " (tp_rank)"));
  }
  if (options.curve->allowed == nullptr) {
    return absl::InvalidArgumentError("--curve-key needs --curve-allowed");
  }
  return absl::OkStatus();
}

// The ZAP options of a context whose CURVE servers take keys of `role` (and `rank`, unless -1).
zmq_auth::ZapOptions ZapFor(const SidecarOptions& options, zmq_auth::KeyRole role, int rank,
                            const std::string& socket) {
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

void Sidecar::Impl::RunDeferredOffOwner() {
  if (deferred.empty()) return;
  std::vector<std::function<void()>> work;
  work.swap(deferred);
  effects.Post("effects", [work = std::move(work)] {
    for (const std::function<void()>& call : work) call();
  });
}

void Sidecar::Impl::PostOwned(std::function<void()> fn) {
  // What the job defers waits in `deferred` until the owner has run every job it took in this
  // wake: then one post to `effects` carries them all, in order (the driver's `run`).
  owner.Post(std::move(fn));
}

// --- outputs --------------------------------------------------------------------------------

void Sidecar::Impl::Publish(const session::RoomEvent& event) {
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

void Sidecar::Impl::PublishRelease(const session::PagesRelease& release) {
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

void Sidecar::Impl::FinishLocked(const session::RoomEvent& event) {
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
  if (prefill) prefill->Free(event.room, absl::Now());
  if (decode) decode->Free(event.room);
}

std::vector<std::pair<uint64_t, std::string>> Sidecar::Impl::SendLocked(
    const std::vector<session::OutboundMessage>& messages) {
  AssertOnOwner("SendLocked");
  std::vector<std::pair<uint64_t, std::string>> lost;
  // A prefill proves its statuses, room digests and fence answers to a session whose key it
  // holds: a sender proof right before each, on the same route (control/wire/proof.h).
  const auto prove = [this](const std::string& endpoint, const std::vector<std::string>& frames) {
    if (std::optional<std::string> key = gate.KeyFor(endpoint)) {
      if (std::optional<std::pair<uint64_t, uint32_t>> id = RoomAndRank(frames)) {
        absl::StatusOr<std::vector<std::string>> proof =
            wire::BuildSenderProof({id->first, id->second, SessionKey::Tag(*key, frames)});
        if (proof.ok()) (void)outbox->Send(endpoint, *proof);
      }
    }
  };
  for (const session::OutboundMessage& m : messages) {
    // A room outcome is kvrail's own (wire/outcome.h): only a kvrail session, one whose key
    // this prefill holds, is sent one; a tokenspeed decode sees CachePD's frames alone.
    if (prefill && wire::IsRoomOutcome(m.frames) && !gate.KeyFor(m.endpoint).has_value()) {
      continue;
    }
    if (prefill) {
      // --verify-digest: the room digest of what this rank wrote to that session goes right
      // before its Success (control/wire/digest.h), proven as the Success is.
      absl::StatusOr<wire::StatusMessage> status =
          !options.verify_digest ? absl::StatusOr<wire::StatusMessage>(absl::NotFoundError(""))
                                 : wire::ParseStatus(m.frames);
      if (status.ok() && status->status == static_cast<int>(TransferPoll::kSuccess)) {
        if (const std::optional<uint64_t> digest =
                prefill->TakeSentDigest(status->room, m.endpoint)) {
          absl::StatusOr<std::vector<std::string>> frames =
              wire::BuildRoomDigest({status->room, status->prefill_rank, *digest});
          if (frames.ok()) {
            prove(m.endpoint, *frames);
            if (outbox->Send(m.endpoint, *frames).ok()) ++stats.room_digests;
          }
        }
      }
      prove(m.endpoint, m.frames);
    }
    // A decode proves that its pre-allocations and fence requests are its own: an owner proof
    // goes right before each, on the same route (control/wire/proof.h).
    if (session_key) {
      if (const std::optional<uint64_t> room = wire::ProvenRoomOf(m.frames)) {
        absl::StatusOr<std::vector<std::string>> proof =
            wire::BuildOwnerProof({*room, session_id, session_key->bytes()});
        if (proof.ok()) (void)outbox->Send(m.endpoint, *proof);
      }
    }
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

void Sidecar::Impl::ApplyLocked(session::PrefillOutput out) {
  AssertOnOwner("ApplyLocked");
  const absl::Time now = absl::Now();
  // A lost status is logged (its decode's waiting timeout and fence still end the room there).
  (void)SendLocked(out.messages);
  for (uint64_t id : out.cancels) {
    Defer([this, id] { (void)scheduler->Cancel(id, "its room failed"); });
  }
  for (uint64_t room : out.fences) metrics.FenceBegan(room, now);
  for (const session::RoomEvent& event : out.events) {
    if (event.state == TransferPoll::kSuccess) stats.bytes_sent += event.bytes;
    if (event.state == TransferPoll::kFailed) metrics.FenceEnded(event.room, now);  // if begun
    FinishLocked(event);  // first: counted before the engine can see the event
    Publish(event);
  }
  for (const auto& [session, endpoint] : out.replaced) {
    // A restarted decode took over the session id: the old process's link and route go.
    Defer([this, session = session, endpoint = endpoint] { DropPeer(session, endpoint); });
  }
  for (session::TransferWork& work : out.transfers) BeginTransferLocked(std::move(work));
}

void Sidecar::Impl::ApplyLocked(session::DecodeOutput out) {
  AssertOnOwner("ApplyLocked");
  // A decode fails the room whose pre-allocation was lost: it must not wait for ever.
  for (const auto& [room, reason] : SendLocked(out.messages)) {
    session::DecodeOutput failed =
        decode->Fail(room, reason, absl::Now(), session::FailureCause::kPeerFailed);
    out.events.insert(out.events.end(), failed.events.begin(), failed.events.end());
    out.releases.insert(out.releases.end(), failed.releases.begin(), failed.releases.end());
    (void)SendLocked(failed.messages);  // its fence requests
  }
  for (const session::RoomEvent& event : out.events) {
    FinishLocked(event);  // first: counted before the engine can see the event
    Publish(event);
  }
  for (const session::PagesRelease& release : out.releases) {
    // Failed means fenced: no release while a copy back into the room's pages is running.
    if (!staging_holds.Hold(release)) PublishRelease(release);
  }
  for (const std::string& dead : out.dead_prefills) {
    spdlog::warn("decode: prefill node {} declared dead (heartbeat)", dead);
    nodes.erase(dead);
  }
}

// --- engine API -----------------------------------------------------------------------------

v1::EngineReply Sidecar::Impl::Handle(const v1::EngineRequest& request) {
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
      out->set_scheduler_rooms(s.scheduler_rooms);
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
        if (prefill) {
          AbortPrefill(request.abort().room(), reason);
        } else {
          AbortDecode(request.abort().room(), reason);
        }
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

bool Sidecar::Impl::TakeSlow(const v1::EngineRequest& request,
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

void Sidecar::Impl::Poll(const v1::Poll& poll, v1::EngineReply& reply) {
  Owned([&] { PollLocked(poll, reply); });
}

void Sidecar::Impl::PollLocked(const v1::Poll& poll, v1::EngineReply& reply) {
  AssertOnOwner("PollLocked");
  for (uint64_t room : poll.rooms()) {
    v1::RoomState* state = reply.add_states();
    state->set_room(room);
    state->set_bootstrap_token(-1);
    // A room that ended: its one terminal event, as its ledger remembers it.
    const session::EndedRoom* ended = prefill  ? prefill->Ended(room)
                                      : decode ? decode->Ended(room)
                                               : nullptr;
    std::optional<TransferPoll> current;
    if (ended != nullptr) {
      current = ended->state;
      state->set_reason(ended->reason);
      state->set_cause(std::string(session::FailureCauseLabel(ended->cause)));
      state->set_bootstrap_token(ended->bootstrap_token);
      for (int32_t id : ended->speculative_ids) state->add_speculative_ids(id);
      state->set_cached_tokens(ended->cached_tokens);
      if (ended->first_token_logprob) state->set_first_token_logprob(*ended->first_token_logprob);
    } else if (prefill) {
      current = prefill->State(room);
      if (current == TransferPoll::kBootstrapped) {
        for (const session::DecodeWindow& window : prefill->Windows(room)) {
          v1::DecodeWindow* w = state->add_windows();
          w->set_session(window.session_id);
          w->set_decode_tp_rank(window.decode_tp_rank);
          w->set_prefix_len(window.prefix_len);
          w->set_prompt_len(window.prompt_len);
        }
      }
    } else if (decode) {
      current = decode->EngineState(room);  // Transferring once a byte may land
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
  for (const auto& [name, value] :
       {std::pair<const char*, absl::Duration>{"--handshake-timeout", options.handshake_timeout},
        {"--connect-timeout", options.connect_timeout},
        {"--fence-timeout", options.fence_timeout},
        {"--fence-wait", options.fence_wait},
        {"--preallocation-wait", options.timeouts.unmatched_preallocation_timeout}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", absl::FormatDuration(value), " must be positive"));
    }
  }
  // spdlog's registry is made on first use, inside libspdlog, whose guard TSan does not see: made
  // here, before the threads below that log, for an engine that runs the sidecar in-process.
  (void)spdlog::default_logger_raw();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  KVRAIL_ASSIGN_OR_RETURN(const std::vector<std::string> host_addresses, HostAddresses());
  KVRAIL_ASSIGN_OR_RETURN(
      impl->options.advertise_host,
      ChooseAdvertiseHost(options.host, options.advertise_host, host_addresses));
  const std::string& advertise = impl->options.advertise_host;
  impl->role_name = options.role == Role::kPrefill ? "prefill" : "decode";
  const bool curve = options.curve != nullptr;
  session::InboxOptions inbox_options;
  inbox_options.on_connection_cut = [impl = impl.get()](const std::string& peer,
                                                        const std::string& why) {
    impl->connections_cut.fetch_add(1);
    // Keyed by host (a reconnect changes the port), apart from the host's message refusals,
    // so that neither kind of line hides the other.
    const std::string host = peer.substr(0, peer.rfind(':')) + " (connections)";
    const session::PeerLogLimiter::Verdict verdict =
        impl->peer_log.Admit(host, session::PeerLogLimiter::Clock::now());
    if (!verdict.log) return;
    spdlog::warn("{}: CachePD connection from {} {}; nothing of it was taken{}", impl->role_name,
                 peer, why,
                 verdict.held_back == 0 ? ""
                                        : absl::StrCat(" (", verdict.held_back, " more from ", host,
                                                       " held back in the last 10 s)"));
  };
  // Deep queues: at 1000 rooms in flight the default 1000 messages per peer overflowed
  // (bench/control).
  session::OutboxOptions outbox_options;
  outbox_options.send_hwm = 100000;
  if (curve) {
    KVRAIL_RETURN_IF_ERROR(CheckOwnKey(options));
    // A prefill's CachePD socket hears decodes; a decode's hears prefills.
    const zmq_auth::KeyRole peers =
        options.role == Role::kPrefill ? zmq_auth::KeyRole::kDecode : zmq_auth::KeyRole::kPrefill;
    KVRAIL_ASSIGN_OR_RETURN(impl->zmq, session::ZmqContext::CreateWithZap(
                                           ZapFor(options, peers, -1, "CachePD socket")));
    auto own = std::make_shared<const zmq_auth::KeyFile>(options.curve->own);
    inbox_options.curve_server = own;
    outbox_options.curve_client = own;
  } else {
    impl->zmq = session::ZmqContext::Create();
  }
  KVRAIL_ASSIGN_OR_RETURN(impl->inbox,
                          session::ZmqInbox::Bind(impl->zmq, options.host, 0, inbox_options));
  // Before anyone is told the address: one nobody reaches fails rooms far from the cause.
  KVRAIL_RETURN_IF_ERROR(CheckAdvertiseHost(advertise, options.host, impl->inbox->port(),
                                            host_addresses, absl::Seconds(1)));
  impl->cachepd_advertised = wire::ReplyEndpoint(advertise, impl->inbox->port());
  impl->outbox = std::make_unique<session::ZmqOutbox>(impl->zmq, outbox_options);
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
  KVRAIL_ASSIGN_OR_RETURN(impl->transport, transport::MakeTransport(spec));
  if (options.role == Role::kDecode) {
    transport::Transport* t = impl->transport.get();
    // The descriptor names this rank's CachePD socket as its registrations do, so that nobody
    // else's registration can claim this session (control/sidecar/registration_gate.h).
    const std::string cachepd = impl->cachepd_advertised;
    impl->session_key = SessionKey::Generate();
    impl->senders.emplace(impl->session_key->bytes());
    const std::string digest = impl->session_key->Digest();
    KVRAIL_ASSIGN_OR_RETURN(
        impl->handshake,
        transport::HandshakeServer::Start(
            options.host, 0,
            impl->descriptor_source =
                [t, cachepd, digest] {
                  absl::StatusOr<v1::HandshakeDescriptor> descriptor = t->LocalDescriptor();
                  if (descriptor.ok()) {
                    descriptor->set_cachepd_endpoint(cachepd);
                    descriptor->set_session_key_digest(digest);
                  }
                  return descriptor;
                },
            advertise,
            curve ? std::optional<zmq_auth::CurveServerKeys>(
                        {options.curve->own,
                         ZapFor(options, zmq_auth::KeyRole::kPrefill, -1, "handshake endpoint")})
                  : std::nullopt));
    impl->session_id = impl->handshake->session_id();
  } else {
    transport::DescriptorCache::Fetcher fetcher;
    if (curve) {
      // The session's handshake endpoint must hold the key of its verified owner.
      fetcher = [raw = impl.get()](absl::string_view session) {
        std::string server_key;
        {
          MutexLock lock(&raw->server_keys_mu);
          auto it = raw->session_server_keys.find(std::string(session));
          if (it != raw->session_server_keys.end()) server_key = it->second;
        }
        if (server_key.empty()) {
          return absl::StatusOr<v1::HandshakeDescriptor>(absl::FailedPreconditionError(
              absl::StrCat("handshake with session ", session,
                           ": CURVE is on and no verified registration names its key")));
        }
        const zmq_auth::CurveClientKeys keys = raw->ClientKeys(server_key);
        return transport::FetchDescriptor(session, raw->options.handshake_timeout, &keys);
      };
    }
    impl->descriptors = std::make_unique<transport::DescriptorCache>(options.handshake_timeout,
                                                                     impl->WithRegistry(fetcher));
    transfer::PeerDirectoryOptions directory_options;
    directory_options.on_fetch = [raw = impl.get()](absl::Duration took, const absl::Status& s) {
      raw->metrics.HandshakeDone(took, s);
    };
    directory_options.on_connect = [raw = impl.get()](absl::Duration took, const absl::Status& s) {
      raw->metrics.ConnectDone(took, s);
    };
    impl->directory = std::make_unique<transfer::PeerDirectory>(
        impl->transport.get(), impl->descriptors.get(), std::move(directory_options));
    transfer::SchedulerOptions scheduler_options;
    scheduler_options.fence_timeout = options.fence_timeout;
    impl->scheduler =
        std::make_unique<transfer::Scheduler>(impl->transport.get(), scheduler_options);
  }
  KVRAIL_RETURN_IF_ERROR(impl->StartRegistry());  // --registry (registry_hooks.cc)
  Impl* raw = impl.get();
  // An ipc socket is its owner's alone already (0600): CURVE guards the engine API on tcp.
  std::optional<zmq_auth::CurveServerKeys> api_curve;
  if (curve && absl::StartsWith(options.engine_endpoint, "tcp://")) {
    api_curve = zmq_auth::CurveServerKeys{
        options.curve->own,
        ZapFor(options, zmq_auth::KeyRole::kEngine, KeyRank(options), "engine API")};
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
  KVRAIL_ASSIGN_OR_RETURN(
      impl->api, engine_api::EngineApiServer::Start(options.engine_endpoint, std::move(handle),
                                                    std::move(take_slow), std::move(api_curve),
                                                    std::move(owner_loop)));
  {
    MutexLock lock(&impl->api_mu);
    impl->api_ready = true;
  }
  impl->api_assigned.notify_all();
  impl->metrics.SetInfo(impl->role_name, options.tp_rank,
                        impl->session_id.empty()
                            ? std::string(absl::StripPrefix(impl->cachepd_advertised, "tcp://"))
                            : impl->session_id);
  impl->metrics.SetStatsSource([raw] { return raw->Stats(); });
  impl->inbox_thread = std::thread([raw] { raw->InboxLoop(); });
  NameThread(impl->inbox_thread, "kvrail-inbox");
  impl->ticker_thread = std::thread([raw] { raw->TickerLoop(); });
  NameThread(impl->ticker_thread, "kvrail-ticker");
  spdlog::info(
      "{} sidecar rank {}/{}: engine API {}, CachePD {}{}{}{}", impl->role_name, options.tp_rank,
      options.tp_size, impl->api->endpoint(), impl->inbox->endpoint(),
      impl->cachepd_advertised == impl->inbox->endpoint()
          ? ""
          : absl::StrCat(" (advertised as ", impl->cachepd_advertised, ")"),
      impl->session_id.empty() ? "" : absl::StrCat(", data-plane session ", impl->session_id),
      curve ? absl::StrCat(", CURVE as ", zmq_auth::UserId(options.curve->own.identity)) : "");
  return std::unique_ptr<Sidecar>(new Sidecar(std::move(impl)));
}

Sidecar::~Sidecar() { Stop(); }

void Sidecar::Stop() {
  Impl& impl = *impl_;
  if (impl.stop.exchange(true)) return;
  impl.StopRegistry();  // a decode's entry goes first: its prefills drop it at once
  // The engine API's thread owns the room state (owner_loop.h, Driven): it takes no more
  // requests, and runs the owner's jobs until everything below is done.
  impl.api->StopServing();
  impl.parser.Stop();  // what it still holds is applied; its answers are dropped
  if (impl.inbox_thread.joinable()) impl.inbox_thread.join();
  if (impl.ticker_thread.joinable()) impl.ticker_thread.join();
  impl.strands.Stop();
  // From here only the data plane's completions post to the owner. What jobs posted before
  // deferred runs now; what they defer from here on is dropped (the scheduler fences all).
  impl.owner.Call([&impl] { impl.RunDeferredOffOwner(); });
  impl.effects.Stop();
  // Fences what is in flight by disconnecting its peers; the outcomes find the rooms and
  // report them Failed to decode ranks still listening.
  impl.scheduler.reset();
  if (impl.handshake) impl.handshake->Stop();
  {
    MutexLock attach_lock(&impl.attach_mu);
    impl.ReleaseArena();
  }
  impl.transport->Close();
  impl.owner.Stop();  // later posts are dropped
  impl.api->Stop();   // its thread runs the outcomes' jobs still queued, then ends
  impl.inbox->Close();
}

const std::string& Sidecar::engine_endpoint() const { return impl_->api->endpoint(); }
const std::string& Sidecar::cachepd_endpoint() const { return impl_->cachepd_advertised; }
const std::string& Sidecar::session_id() const { return impl_->session_id; }

SidecarStats Sidecar::stats() const { return impl_->Stats(); }
const metrics::Registry& Sidecar::metrics() const { return impl_->metrics.registry(); }

SidecarStats Sidecar::Impl::Stats() {
  SidecarStats out;
  Owned([&] {
    out = stats;
    out.peer_messages_rejected += connections_cut.load();
    if (prefill) {
      out.rooms = prefill->room_count();
      out.failed_rooms_remembered = prefill->RememberedFailedCount();
      out.registrations = prefill->Registrations().size();
    }
    if (decode) {
      out.rooms = decode->room_count();
      out.fences = decode->fence_count();
    }
    if (prefill) out.transfers = prefill->rooms_transferring();
    out.registrations_held = gate.held();
    if (prefill) out.finished_remembered = prefill->EndedCount();
    if (decode) out.finished_remembered = decode->EndedCount();
    if (attached) {  // written before `attached` was set, read-only while it is
      out.arena_bytes = arena_bytes;
      out.layers = contract_layers;
    }
  });
  // Each of these has a lock of its own.
  out.outbox_peers = outbox->peer_count();
  if (directory) out.data_plane_peers = directory->size();
  if (transport) {
    out.rail_failovers = transport->transport_counters().rail_failovers;
    // Every backend opens one endpoint (QP) per lane to each peer it connects.
    out.endpoints = out.data_plane_peers * static_cast<uint64_t>(transport->capabilities().lanes);
    // The transport's own list (under its lock), not the sidecar's bookkeeping of its arena.
    absl::StatusOr<v1::HandshakeDescriptor> local = transport->LocalDescriptor();
    if (local.ok()) out.regions = static_cast<uint64_t>(local->regions_size());
  }
  if (scheduler) {
    out.scheduler_rooms = scheduler->rooms_in_flight();
    out.scheduler_peers = scheduler->peers();
  }
  out.strands = strands.strands();
  out.bootstrap_registrations = bootstrap_registrations.load();
  if (api) out.engines = api->engines();
  return out;
}

}  // namespace kvrail::sidecar
