// A prefill rank's sidecar (prefill_sidecar.h): start and stop of its data plane, its ledger's
// life with the arena, what Poll and Stats read of it, and how its outputs are applied. Peer
// messages and the ticker's turn: prefill_peers.cc; a room's transfers: prefill_transfers.cc.
#include "control/sidecar/prefill_sidecar.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"
#include "control/plan/layerwise.h"
#include "control/session/ended_room.h"
#include "control/wire/digest.h"
#include "control/wire/outcome.h"
#include "control/wire/proof.h"
#include "control/wire/row_staging.h"
#include "control/wire/status.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

using session::TransferPoll;

PrefillSidecar::PrefillSidecar(const SidecarOptions& options) : SidecarCore(options, "prefill") {}

absl::Status PrefillSidecar::CheckOptions() const {
  return SplitHostPort(options.bootstrap, "--bootstrap").status();
}

int PrefillSidecar::KeyRank() const {
  return plan::GlobalPrefillRank(options.pp_rank, options.tp_size, options.tp_rank);
}

absl::Status PrefillSidecar::StartDataPlane() {
  transport::DescriptorCache::Fetcher fetcher;
  if (options.curve != nullptr) {
    // The session's handshake endpoint must hold the key of its verified owner.
    fetcher = [raw = this](absl::string_view session) {
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
  descriptors = std::make_unique<transport::DescriptorCache>(options.handshake_timeout,
                                                             WithRegistry(fetcher));
  transfer::PeerDirectoryOptions directory_options;
  directory_options.on_fetch = [raw = this](absl::Duration took, const absl::Status& s) {
    raw->metrics.HandshakeDone(took, s);
  };
  directory_options.on_connect = [raw = this](absl::Duration took, const absl::Status& s) {
    raw->metrics.ConnectDone(took, s);
  };
  directory = std::make_unique<transfer::PeerDirectory>(transport.get(), descriptors.get(),
                                                        std::move(directory_options));
  transfer::SchedulerOptions scheduler_options;
  scheduler_options.fence_timeout = options.fence_timeout;
  scheduler = std::make_unique<transfer::Scheduler>(transport.get(), scheduler_options);
  return absl::OkStatus();
}

void PrefillSidecar::StopDataPlane() {
  // Fences what is in flight by disconnecting its peers; the outcomes find the rooms and
  // report them Failed to decode ranks still listening.
  scheduler.reset();
}

absl::Status PrefillSidecar::StartRooms(const v1::AttachArena& attach,
                                        const layout::Contract& parsed) {
  session::PrefillIdentity identity;
  identity.prefill_tp_size = options.tp_size;
  identity.prefill_tp_rank = options.tp_rank;
  identity.status_rank = plan::GlobalPrefillRank(options.pp_rank, options.tp_size, options.tp_rank);
  identity.contract = parsed;
  std::optional<plan::PipelineLayout> pipeline;
  if (options.pp_size > 1) {
    KVRAIL_ASSIGN_OR_RETURN(pipeline, StageLayout(attach, parsed));
    identity.stage = pipeline->FilterFor(options.pp_rank);
  }
  session::PrefillOptions prefill_options;
  prefill_options.remembered_rooms = options.remembered_rooms;
  prefill_options.timeouts = options.timeouts;
  prefill_options.max_room_bytes = options.max_room_bytes;
  prefill_options.ignore_repeated_preallocations = true;  // docs/SECURITY.md
  prefill_options.unknown_sessions_change_nothing = true;
  prefill_options.send_outcomes = true;  // to kvrail sessions only (SendLocked)
  prefill_options.max_rooms = options.max_rooms;
  prefill_options.max_rooms_per_session = options.max_rooms_per_session;
  prefill_options.max_registrations = options.max_registrations;
  prefill_options.revision = options.cachepd_revision;
  KVRAIL_ASSIGN_OR_RETURN(session::PrefillRooms ledger,
                          session::PrefillRooms::Create(identity, prefill_options));
  // What this rank registers with the node's bootstrap server (CACHEPD §1.2, §2.1).
  bootstrap::PrefillRegistration r;
  r.world_size = options.tp_size * options.dp_size * options.pp_size;
  r.dp_size = options.dp_size;
  r.endpoint.rank_ip = options.advertise_host;
  r.endpoint.rank_port = inbox->port();
  // CURVE on: decode ranks learn this rank's server key from the bootstrap server.
  if (options.curve) r.endpoint.curve_public_key = options.curve->own.public_key;
  // Ranks of a DP group are numbered stage-major (control/plan/pipeline.h).
  r.engine_rank = options.dp_rank * options.tp_size * options.pp_size + identity.status_rank;
  r.contract = parsed;
  r.pipeline = pipeline;
  registration = std::move(r);
  Owned([&] {
    rooms.emplace(std::move(ledger));
    attached = true;
  });
  return absl::OkStatus();
}

absl::Status PrefillSidecar::AnnounceArena() {
  return AddContext(RegisterWithBootstrap(), "registering with the bootstrap");
}

absl::Status PrefillSidecar::RegisterWithBootstrap() const {
  KVRAIL_ASSIGN_OR_RETURN(auto server, SplitHostPort(options.bootstrap, "--bootstrap"));
  bootstrap::BootstrapClientOptions client_options;
  client_options.bearer_token = options.bootstrap_bearer_token;
  // A prefill sidecar is often started beside its node's bootstrap server, which may still be
  // starting (in another network namespace, `ip netns exec` first): retry a refused or reset
  // connection for up to about 5.5 s (backoff 0.1 s doubling to 1 s), inside the client's 10 s
  // deadline, instead of giving up after 0.7 s.
  client_options.retries = 8;
  client_options.cachepd_revision = options.cachepd_revision;
  bootstrap::BootstrapClient client(server.first, server.second, client_options);
  layout::Revision form = layout::kNewestRevision;
  KVRAIL_RETURN_IF_ERROR(client.RegisterPrefillRank(*registration, &form));
  // The first registration says which revision the node's bootstrap server speaks, and so the
  // form its decodes read this rank's layout in (CACHEPD §12.12).
  if (bootstrap_registrations.fetch_add(1) == 0) {
    spdlog::info("event=bootstrap_registered bootstrap={} cachepd_revision={}", options.bootstrap,
                 std::string(layout::RevisionName(form)));
  }
  return absl::OkStatus();
}

absl::StatusOr<plan::PipelineLayout> PrefillSidecar::StageLayout(
    const v1::AttachArena& attach, const layout::Contract& parsed) const {
  plan::PipelineLayout pipeline;
  pipeline.pp_size = options.pp_size;
  if (attach.fields_by_stage_size() > 0) {
    for (const v1::FieldList& stage : attach.fields_by_stage()) {
      pipeline.fields_by_stage.emplace_back(stage.field_ids().begin(), stage.field_ids().end());
    }
  } else {
    std::vector<std::string> layers;  // distinct layer prefixes, in plan order
    for (const layout::FieldLayout& field : parsed.plan.fields) {
      const std::string prefix = field.field_id.substr(0, field.field_id.rfind('.'));
      if (layers.empty() || layers.back() != prefix) layers.push_back(prefix);
    }
    pipeline.fields_by_stage.resize(options.pp_size);
    for (const layout::FieldLayout& field : parsed.plan.fields) {
      const std::string prefix = field.field_id.substr(0, field.field_id.rfind('.'));
      const size_t layer = std::find(layers.begin(), layers.end(), prefix) - layers.begin();
      const size_t stage = layer * options.pp_size / layers.size();
      pipeline.fields_by_stage[stage].push_back(field.field_id);
    }
  }
  KVRAIL_RETURN_IF_ERROR(
      AddContext(plan::ValidatePipelineLayout(pipeline, parsed), "AttachArena: fields_by_stage"));
  return pipeline;
}

void PrefillSidecar::VoidRoomsLocked(const std::string& reason) {
  ApplyLocked(rooms->AbortBegunRooms(reason, RoomNow()));
}

void PrefillSidecar::ForgetRooms() {
  Owned([&] {
    attached = false;
    rooms.reset();
  });
  registration.reset();
}

// --- what Poll and Stats read -----------------------------------------------------------------

const session::EndedRoom* PrefillSidecar::EndedLocked(uint64_t room) const {
  return rooms ? rooms->Ended(room) : nullptr;
}

std::optional<TransferPoll> PrefillSidecar::RoomStateLocked(uint64_t room,
                                                            v1::RoomState& state) const {
  std::optional<TransferPoll> current = rooms->State(room);
  if (current == TransferPoll::kBootstrapped) {
    for (const session::DecodeWindow& window : rooms->Windows(room)) {
      v1::DecodeWindow* w = state.add_windows();
      w->set_session(window.session_id);
      w->set_decode_tp_rank(window.decode_tp_rank);
      w->set_prefix_len(window.prefix_len);
      w->set_prompt_len(window.prompt_len);
    }
  }
  return current;
}

void PrefillSidecar::LedgerStatsLocked(SidecarStats& out) const {
  out.rooms = rooms->room_count();
  out.failed_rooms_remembered = rooms->RememberedFailedCount();
  out.registrations = rooms->Registrations().size();
  out.transfers = rooms->rooms_transferring();
  out.finished_remembered = rooms->EndedCount();
  out.registrations_held = gate.held();
}

void PrefillSidecar::DataPlaneStats(SidecarStats& out) const {
  if (directory) out.data_plane_peers = directory->size();
  if (scheduler) {
    out.scheduler_transfers = scheduler->transfers_in_flight();
    out.scheduler_peers = scheduler->peers();
  }
  out.bootstrap_registrations = bootstrap_registrations.load();
}

// --- outputs ----------------------------------------------------------------------------------

void PrefillSidecar::FreeLocked(uint64_t room) { rooms->Free(room, RoomNow()); }

bool PrefillSidecar::PrepareSendLocked(const session::OutboundMessage& m) {
  // A room outcome is kvrail's own (wire/outcome.h): only a kvrail session, one whose key
  // this prefill holds, is sent one; a tokenspeed decode sees CachePD's frames alone.
  const std::optional<std::string> key = gate.KeyFor(m.endpoint);
  if (wire::IsRoomOutcome(m.frames) && !key.has_value()) return false;
  // A prefill proves its statuses, room digests and fence answers to a session whose key it
  // holds: a sender proof right before each, on the same route (control/wire/proof.h).
  const auto prove = [this, &key, &m](const std::vector<std::string>& frames) {
    if (!key) return;
    if (std::optional<std::pair<uint64_t, uint32_t>> id = RoomAndRank(frames)) {
      absl::StatusOr<std::vector<std::string>> proof =
          wire::BuildSenderProof({id->first, id->second, SessionKey::Tag(*key, frames)});
      if (proof.ok()) (void)outbox->Send(m.endpoint, *proof);
    }
  };
  // Right before its Success, proven as the Success is: the answer to the session's staging
  // offer (control/wire/row_staging.h), and under --verify-digest the room digest of what this
  // rank wrote to that session (control/wire/digest.h).
  absl::StatusOr<wire::StatusMessage> status =
      key ? wire::ParseStatus(m.frames)
          : absl::StatusOr<wire::StatusMessage>(absl::NotFoundError(""));
  if (status.ok() && status->status == static_cast<int>(TransferPoll::kSuccess)) {
    if (const std::optional<bool> staged = rooms->TakeStagingAnswer(status->room, m.endpoint)) {
      absl::StatusOr<std::vector<std::string>> frames =
          wire::BuildStagingAnswer({status->room, status->prefill_rank, *staged});
      if (frames.ok()) {
        prove(*frames);
        (void)outbox->Send(m.endpoint, *frames);
      }
    }
    const std::optional<uint64_t> digest =
        options.verify_digest ? rooms->TakeSentDigest(status->room, m.endpoint) : std::nullopt;
    if (digest) {
      absl::StatusOr<std::vector<std::string>> frames =
          wire::BuildRoomDigest({status->room, status->prefill_rank, *digest});
      if (frames.ok()) {
        prove(*frames);
        if (outbox->Send(m.endpoint, *frames).ok()) ++stats.room_digests;
      }
    }
  }
  prove(m.frames);
  return true;
}

void PrefillSidecar::ApplyLocked(session::PrefillOutput out) {
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
    ForgetWarmLinkLocked(session);
    Defer([this, session = session, endpoint = endpoint] { DropPeer(session, endpoint); });
  }
  for (session::TransferWork& work : out.transfers) BeginTransferLocked(std::move(work));
}

}  // namespace kvrail::sidecar
