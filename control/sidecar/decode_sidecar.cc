// A decode rank's sidecar (decode_sidecar.h): start and stop of its handshake endpoint, its
// ledger's life with the arena, what Poll and Stats read of it, and how its outputs are applied.
// Peer messages and the ticker's turn: decode_peers.cc; Expect and routes: decode_routing.cc.
#include "control/sidecar/decode_sidecar.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "control/session/ended_room.h"
#include "control/wire/proof.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

using session::TransferPoll;

DecodeSidecar::DecodeSidecar(const SidecarOptions& options) : SidecarCore(options, "decode") {}

absl::Status DecodeSidecar::StartDataPlane() {
  transport::Transport* t = transport.get();
  // The descriptor names this rank's CachePD socket as its registrations do, so that nobody
  // else's registration can claim this session (control/sidecar/registration_gate.h).
  const std::string cachepd = cachepd_advertised;
  session_key = SessionKey::Generate();
  senders.emplace(session_key->bytes());
  const std::string digest = session_key->Digest();
  KVRAIL_ASSIGN_OR_RETURN(
      handshake,
      transport::HandshakeServer::Start(
          options.host, 0,
          descriptor_source =
              [t, cachepd, digest] {
                absl::StatusOr<v1::HandshakeDescriptor> descriptor = t->LocalDescriptor();
                if (descriptor.ok()) {
                  descriptor->set_cachepd_endpoint(cachepd);
                  descriptor->set_session_key_digest(digest);
                }
                return descriptor;
              },
          options.advertise_host,
          options.curve != nullptr ? std::optional<zmq_auth::CurveServerKeys>(
                                         {options.curve->own, ZapFor(zmq_auth::KeyRole::kPrefill,
                                                                     -1, "handshake endpoint")})
                                   : std::nullopt));
  session_id = handshake->session_id();
  return absl::OkStatus();
}

void DecodeSidecar::StopDataPlane() {
  if (handshake) handshake->Stop();
}

absl::Status DecodeSidecar::StartRooms(const v1::AttachArena& attach,
                                       const layout::Contract& parsed) {
  (void)attach;
  session::DecodeIdentity identity;
  identity.endpoint = options.advertise_host;
  identity.port = inbox->port();
  identity.session_id = session_id;
  identity.arena_base = arena_base;
  identity.contract = parsed;
  identity.decode_tp_size = options.tp_size;
  identity.decode_tp_rank = options.tp_rank;
  session::DecodeOptions decode_options;
  decode_options.timeouts = options.timeouts;
  decode_options.fence_wait = options.fence_wait;
  decode_options.remembered_rooms = options.remembered_rooms;
  decode_options.revision = options.cachepd_revision;
  KVRAIL_ASSIGN_OR_RETURN(session::DecodeRooms ledger,
                          session::DecodeRooms::Create(identity, decode_options));
  Owned([&] {
    rooms.emplace(std::move(ledger));
    attached = true;
  });
  return StartRowStaging();
}

absl::Status DecodeSidecar::AnnounceArena() {
  PublishDescriptor();  // --registry: now that the arena is registered
  return absl::OkStatus();
}

void DecodeSidecar::VoidRoomsLocked(const std::string& reason) {
  ApplyLocked(rooms->FailAll(reason, RoomNow()));
}

void DecodeSidecar::ForgetRooms() {
  Owned([&] {
    attached = false;
    rooms.reset();
  });
  StopRowStaging();
}

// --- what Poll and Stats read -----------------------------------------------------------------

const session::EndedRoom* DecodeSidecar::EndedLocked(uint64_t room) const {
  return rooms ? rooms->Ended(room) : nullptr;
}

std::optional<TransferPoll> DecodeSidecar::RoomStateLocked(uint64_t room,
                                                           v1::RoomState& state) const {
  (void)state;
  return rooms->EngineState(room);  // Transferring once a byte may land
}

void DecodeSidecar::LedgerStatsLocked(SidecarStats& out) const {
  out.rooms = rooms->room_count();
  out.fences = rooms->fence_count();
  out.finished_remembered = rooms->EndedCount();
}

void DecodeSidecar::DataPlaneStats(SidecarStats& out) const {
  (void)out;  // a decode opens no data-plane endpoint: its prefills' reach it
}

// --- outputs ----------------------------------------------------------------------------------

void DecodeSidecar::FreeLocked(uint64_t room) { rooms->Free(room); }

bool DecodeSidecar::PrepareSendLocked(const session::OutboundMessage& m) {
  // A decode proves that its pre-allocations and fence requests are its own: an owner proof
  // goes right before each, on the same route (control/wire/proof.h).
  OfferRowStagingLocked(m);  // row staging: an offer goes right before its pre-allocation
  if (const std::optional<uint64_t> room = wire::ProvenRoomOf(m.frames)) {
    absl::StatusOr<std::vector<std::string>> proof =
        wire::BuildOwnerProof({*room, session_id, session_key->bytes()});
    if (proof.ok()) (void)outbox->Send(m.endpoint, *proof);
  }
  return true;
}

void DecodeSidecar::ApplyLocked(session::DecodeOutput out) {
  AssertOnOwner("ApplyLocked");
  // A decode fails the room whose pre-allocation was lost: it must not wait for ever.
  for (const auto& [room, reason] : SendLocked(out.messages)) {
    session::DecodeOutput failed =
        rooms->Fail(room, reason, RoomNow(), session::FailureCause::kPeerFailed);
    out.events.insert(out.events.end(), failed.events.begin(), failed.events.end());
    out.releases.insert(out.releases.end(), failed.releases.begin(), failed.releases.end());
    (void)SendLocked(failed.messages);  // its fence requests
  }
  for (const session::RoomEvent& event : out.events) {
    // Row staging: a room that ended with its pages the engine's again (Success, or Failed
    // with nothing that may still land) gives its slots back.
    if (event.state == TransferPoll::kSuccess ||
        (event.state == TransferPoll::kFailed && event.pages == session::Pages::kReusable)) {
      ReturnRoomSlotsLocked(event.room, /*proven=*/true);
    }
    FinishLocked(event);  // first: counted before the engine can see the event
    Publish(event);
  }
  // Failed means fenced: the ledger releases no pages while a copy back into them runs.
  for (const session::PagesRelease& release : out.releases) {
    ReturnRoomSlotsLocked(release.room, release.proven);
    PublishRelease(release);
  }
  for (const std::string& dead : out.dead_prefills) {
    spdlog::warn("decode: prefill node {} declared dead (heartbeat)", dead);
    nodes.erase(dead);
  }
  // A prefill rank fenced a room by disconnecting a data plane that did not drain: what it had
  // handed over may still come. Its connections so far are refused, off the owner (each lane
  // applies it between rounds: Transport::RefuseWriter), and then the ledger hears whether they
  // were: refused, the room's pages are released proven; else unproven, as before.
  for (const std::string& writer : out.refuse_writers) {
    Defer([this, writer] {
      const bool refused = RefuseWriter(writer, "fenced a room by a disconnect");
      PostOwned([this, writer, refused] {
        if (rooms) ApplyLocked(rooms->OnWriterRefused(writer, refused, RoomNow()));
      });
    });
  }
}

}  // namespace kvrail::sidecar
