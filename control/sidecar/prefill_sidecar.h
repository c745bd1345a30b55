// A prefill rank's sidecar (sidecar_core.h): its one room ledger (session::PrefillRooms, whose
// entry per room holds the room's state, its decodes' windows, its transfers and its sent
// digests), the decode registrations it verifies (registration_gate.h), and the data plane that
// writes into decodes' pages (descriptor cache, peer directory, scheduler). Its files:
// prefill_sidecar.cc, prefill_transfers.cc, session_identity.cc, and its parts of
// arena_staging.cc and registry_hooks.cc.
#ifndef KVRAIL_CONTROL_SIDECAR_PREFILL_SIDECAR_H_
#define KVRAIL_CONTROL_SIDECAR_PREFILL_SIDECAR_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "control/bootstrap/registration.h"
#include "control/plan/pipeline.h"
#include "control/session/prefill_rooms.h"
#include "control/sidecar/descriptor_registry.h"
#include "control/sidecar/key_binding.h"
#include "control/sidecar/liveness.h"
#include "control/sidecar/registration_gate.h"
#include "control/sidecar/sender_check.h"
#include "control/sidecar/session_key.h"
#include "control/sidecar/sidecar_core.h"
#include "control/sidecar/staging_offers.h"
#include "engine/transfer/copy_list_pool.h"
#include "engine/transfer/lane_set.h"
#include "engine/transfer/peer_directory.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/handshake/handshake.h"

namespace kvrail::sidecar {

// A room's transfers while they are prepared (prefill_transfers.cc).
struct Preparation;
struct PreparedTransfer;
struct DestinationJob;

class PrefillSidecar final : public SidecarCore {
 public:
  explicit PrefillSidecar(const SidecarOptions& options);

  // The room ledger, once an arena is attached. Owner thread only.
  std::optional<session::PrefillRooms> rooms;
  std::unique_ptr<transport::DescriptorCache> descriptors;
  std::unique_ptr<transfer::PeerDirectory> directory;
  std::unique_ptr<transfer::Scheduler> scheduler;
  // Rooms' copy lists, reused (copy_list_pool.h); shared with the lists' recycle callbacks.
  std::shared_ptr<transfer::CopyListPool> copy_lists = std::make_shared<transfer::CopyListPool>();
  // What this rank registers with its bootstrap server (again after it came back). Written
  // under attach_mu.
  std::optional<bootstrap::PrefillRegistration> registration;
  mutable std::atomic<uint64_t> bootstrap_registrations{0};  // accepted, re-registrations too
  bool bootstrap_answered = true;                            // ticker thread only
  RegistrationGate gate;  // registrations wait here for their owner's descriptor
  KeyBinding keys;        // CURVE on: which key may send what (key_binding.h)
  // When each registered session's handshake endpoint last accepted a probe (or was first
  // probed), for --registration-ttl. Owner thread.
  std::map<std::string, absl::Time> session_reached;
  // The links of warm routes (a room was prepared over them), by session: the next room of
  // such a session is prepared on the owner, with no hand-off to its strand. A copy of the
  // peer directory's link, kept by the owner; forgotten when the link is dropped. link_drops
  // counts the drops, so that a preparation begun before one does not bring its link back.
  // Owner thread.
  std::map<std::string, transfer::PeerLink> warm_links;
  uint64_t link_drops = 0;
  // The registration each session's copies were last logged for (LogRouteLocked): a route's
  // choice of copies is logged once, at its first room. Forgotten with the session. Owner.
  std::map<std::string, std::weak_ptr<const session::DecodePeer>> logged_routes;
  // Row staging: decodes' offers of a slot for a room, until the room's first work to that
  // session takes them (control/wire/row_staging.h). Owner thread.
  StagingOffers staging_offers;
  // Data-plane peers of dropped sessions, for the scheduler to forget once idle. Owner thread.
  std::vector<transport::PeerId> forget_peers;
  // CURVE on: the public key of each session's verified owner, which its handshake endpoint
  // must hold (the data plane's descriptor fetches read it off the owner thread).
  Mutex server_keys_mu;
  std::map<std::string, std::string> session_server_keys ABSL_GUARDED_BY(server_keys_mu);
  // --registry: the decodes' descriptors, watched (registry_hooks.cc). Last, so that it goes
  // first: the watcher's hooks use the parts above.
  std::unique_ptr<RegistryDescriptors> registry_descriptors;

  // CURVE on: the client keys to reach a server holding `public_key`.
  zmq_auth::CurveClientKeys ClientKeys(const std::string& public_key) const {
    return {options.curve->own, public_key};
  }

  // --- prefill_sidecar.cc -------------------------------------------------------------------
  // Applies what PrefillRooms asked: messages, cancels (deferred), fences' clocks, events,
  // replaced sessions, transfers to prepare.
  void ApplyLocked(session::PrefillOutput out);
  // On the owner thread: hands one CachePD message to the ledger. `host` sent the message (the
  // inbox's Peer-Address; empty if unknown): refusals are logged at most once per host per 10 s.
  void HandleMessageLocked(const std::vector<std::string>& message, absl::Time now,
                           const std::string& host);
  // On the owner thread: keeps a decode's staging offer (wire/row_staging.h) for its room's
  // first work, or refuses one that does not parse.
  void KeepStagingOfferLocked(const std::vector<std::string>& message, const std::string& host);
  // Checks a registration the gate holds against its session's descriptor, in that session's
  // strand, then lets the gate release what waited (registration_gate.h).
  void VerifyRegistration(RegistrationGate::Check check);
  // Sessions whose sockets refuse connections are gone (liveness.h), and so are those whose port
  // answers for another process (ConfirmSessions) or that answered no probe for
  // --registration-ttl: each is dropped (DropSessionLocked). Then the scheduler forgets the
  // peers of dropped sessions once idle.
  void ProbePeers(const std::vector<std::string>& sessions);
  // Off the owner thread: a session whose port accepts connections may still be gone, its
  // port taken by another program or by its own successor. Asks each session that `reach` says
  // listens for its descriptor, all at once, and compares the session key digest with the one
  // its registration was verified with (session_identity.cc). Returns, for each session, why
  // it is gone (empty when it is not), and turns into kUnknown the reach of those that did not
  // answer: silent for --registration-ttl, they are dropped as the unreachable are.
  std::vector<std::string> ConfirmSessions(const std::vector<std::string>& sessions,
                                           std::vector<Reach>& reach);
  // On the owner thread: drops `session` (its rooms fail with `reason`) and defers forgetting
  // its data plane. Why a session is dropped: the label of kvrail_sessions_dropped_total and its
  // rooms' cause.
  enum class Drop { kRefused, kOtherProcess, kSilent, kRegistry };
  void DropSessionLocked(const std::string& session, const std::string& reason, Drop why,
                         absl::Time now);
  // A bootstrap server that restarted has forgotten this rank: registers again when it answers
  // but does not list this rank's endpoint.
  void ReregisterIfForgotten();
  // Registers this rank with its bootstrap server (HTTP: never on the owner thread).
  absl::Status RegisterWithBootstrap() const;
  absl::StatusOr<plan::PipelineLayout> StageLayout(const v1::AttachArena& attach,
                                                   const layout::Contract& parsed) const;

  // --- prefill_transfers.cc -----------------------------------------------------------------
  absl::Status Ready(const v1::Ready& ready) override;
  absl::Status LayersReady(const v1::LayersReady& layers) override;
  // The engine has the request: the room exists from now on, and its Bootstrapped (with the
  // decodes' windows) comes as an event.
  absl::Status Begin(const v1::Begin& begin) override;
  void AbortLocked(uint64_t room, const std::string& reason) override;
  // On the owner thread: refuses a room whose terminal event went out (PrefillRooms::BeginRoom
  // says so: "room N already failed: <reason>"), else begins it and applies what that says;
  // errors prefixed `context`.
  absl::Status BeginPrefillRoomLocked(uint64_t room, absl::Time now, const std::string& context);
  // A room's transfer may start: prepare each destination, on the owner where its route is warm
  // (warm_links), else in its session's strand; the last one prepared submits the room.
  void BeginTransferLocked(session::TransferWork work);
  // One destination's transfer request over `link`: its copies (streamed, or listed to be
  // staged or hashed), its bounds, its digest. On the owner or a strand; touches only `slot`.
  void PrepareDestination(const Preparation& preparation, PreparedTransfer& slot,
                          const DestinationJob& job, const transfer::PeerLink& link);
  // Once every destination is prepared: tells the ledger, and defers the submits it allows.
  void SubmitPreparedLocked(const std::shared_ptr<Preparation>& preparation);
  // `session`'s link is not warm any more (dropped, or its session replaced or gone).
  void ForgetWarmLinkLocked(const std::string& session);
  // Whether rooms to `peer` are hashed in their final work: --verify-digest, and the session is
  // kvrail's (it has a key); the decode then checks every byte the room landed.
  bool Hashed(const session::DecodePeer& peer) const;
  // Whether a room's copies are streamed as strided copies (a head-sliced page's rows as one):
  // not under --naive-copies or --no-strided-copies, which take a copy per row. (A hashed room's
  // digest counts a strided copy's rows one by one: plan::RoomDigest.)
  bool StridedCopies() const;
  // Logs, once per registration, how a route's rooms are copied: whole pages, or head-sliced
  // rows as strided copies (and whether the transport takes them whole) or one copy per row;
  // and on which lanes.
  void LogRouteLocked(const std::shared_ptr<const session::DecodePeer>& peer);
  // The lanes a route's transfers post on (Transfer::lanes).
  transfer::LaneSet LanesFor(const session::DecodePeer& peer) const;
  void OnTransferOutcome(const transfer::TransferOutcome& outcome);
  // Forgets what the data plane keeps for `session` (its link, descriptor, and once idle its
  // scheduler queue) and, unless a registration still uses it, the PUSH socket to
  // `reply_endpoint` (empty: keep it). Calls into engine/: never on the owner thread.
  void DropPeer(const std::string& session, const std::string& reply_endpoint);

  // --- arena_staging.cc ---------------------------------------------------------------------
  // Staged arena, off the owner thread: copies the source ranges of `copies` to the mirror,
  // before any write reads them.
  absl::Status StageSources(const plan::CopyList& copies);

  // --- registry_hooks.cc --------------------------------------------------------------------
  absl::Status StartRegistry() override;  // the watcher, under --registry
  void StopRegistry() override;
  // `fallback` (null: the plain handshake fetch), asked only for sessions the registry has no
  // descriptor of. Unchanged without --registry or under CURVE.
  transport::DescriptorCache::Fetcher WithRegistry(transport::DescriptorCache::Fetcher fallback);

  // --- the hooks (sidecar_core.h), in prefill_sidecar.cc ------------------------------------
  absl::Status CheckOptions() const override;
  zmq_auth::KeyRole KeyRole() const override { return zmq_auth::KeyRole::kPrefill; }
  int KeyRank() const override;  // the status rank: pp_rank * tp_size + tp_rank
  std::string KeyRankRule() const override { return "pp_rank * tp_size + tp_rank"; }
  zmq_auth::KeyRole PeerKeyRole() const override { return zmq_auth::KeyRole::kDecode; }
  absl::Status StartDataPlane() override;
  void StopDataPlane() override;
  absl::Status StartRooms(const v1::AttachArena& attach, const layout::Contract& parsed) override;
  absl::Status AnnounceArena() override;
  void VoidRoomsLocked(const std::string& reason) override;
  void ForgetRooms() override;
  const session::EndedRoom* EndedLocked(uint64_t room) const override;
  std::optional<session::TransferPoll> RoomStateLocked(uint64_t room,
                                                       v1::RoomState& state) const override;
  void FreeLocked(uint64_t room) override;
  bool PrepareSendLocked(const session::OutboundMessage& m) override;
  absl::Status CheckKeyLocked(const std::string& user_id,
                              const std::vector<std::string>& message) override;
  void OnPeerMessageLocked(InboxMessage& in) override;
  bool Turn(absl::Duration held, bool beat) override;
  void LiveRoutesLocked(std::set<std::string>& live) const override;
  void LedgerStatsLocked(SidecarStats& out) const override;
  void DataPlaneStats(SidecarStats& out) const override;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_PREFILL_SIDECAR_H_
