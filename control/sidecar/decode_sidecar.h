// A decode rank's sidecar (sidecar_core.h): its one room ledger (session::DecodeRooms, whose
// entry per room holds the room's state, route, destination manifest, received digests and
// fences), the prefill nodes it has looked up, the sender proofs of their ranks
// (sender_check.h), and the data-plane endpoint prefills fetch its descriptor from. Its files:
// decode_sidecar.cc, decode_routing.cc, room_digests.cc, and its parts of arena_staging.cc and
// registry_hooks.cc.
#ifndef KVRAIL_CONTROL_SIDECAR_DECODE_SIDECAR_H_
#define KVRAIL_CONTROL_SIDECAR_DECODE_SIDECAR_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "control/plan/copy_plan.h"
#include "control/plan/prefill_description.h"
#include "control/session/decode_rooms.h"
#include "control/sidecar/descriptor_registry.h"
#include "control/sidecar/sender_check.h"
#include "control/sidecar/session_key.h"
#include "control/sidecar/sidecar_core.h"
#include "control/sidecar/staging_slots.h"
#include "engine/transport/handshake/handshake.h"

namespace kvrail::sidecar {

class DecodeSidecar final : public SidecarCore {
 public:
  explicit DecodeSidecar(const SidecarOptions& options);

  // The room ledger, once an arena is attached. Owner thread only.
  std::optional<session::DecodeRooms> rooms;
  std::unique_ptr<transport::HandshakeServer> handshake;
  std::optional<SessionKey> session_key;  // proves its CachePD messages its own
  std::optional<SenderCheck> senders;     // the sender proofs of prefill nodes
  // Per bootstrap address, the node's description and planner, and rank endpoints. Owner thread.
  struct PrefillNode {
    plan::PrefillDescription description;
    plan::DecodeTargets targets;  // this decode rank's E_d, Z_d, T_d against the node
    bool kvrail = false;          // its bootstrap server says its ranks prove their messages
    std::map<std::pair<int, int>, std::string> endpoints;  // (dp group, rank) -> tcp://
    // --verify-digest: per prefill rank, where its copies land here (plan::LandingPlan).
    std::map<int, std::shared_ptr<const plan::CopyPlan>> landing_plans;
  };
  std::map<std::string, std::shared_ptr<PrefillNode>> nodes;
  // What the handshake endpoint serves, for the registry too.
  transport::HandshakeServer::Source descriptor_source;
  // --registry: this rank's descriptor, published (registry_hooks.cc). Last, so that it goes
  // first.
  std::unique_ptr<DescriptorPublisher> registry_publisher;

  // --- decode_sidecar.cc --------------------------------------------------------------------
  // Applies what DecodeRooms asked: messages (a room whose pre-allocation was lost fails),
  // events, page releases (held while a staged copy runs), prefill nodes declared dead.
  void ApplyLocked(session::DecodeOutput out);
  // On the owner thread: hands one CachePD message to the ledger. `host` sent the message (the
  // inbox's Peer-Address; empty if unknown): refusals are logged at most once per host per 10 s.
  void HandleMessageLocked(const std::vector<std::string>& message, absl::Time now,
                           const std::string& host);
  // On the owner thread: whether `message` (a status or fence answer) must come with a sender
  // proof (SidecarOptions::sender_proofs).
  bool SenderProofRequiredLocked(const std::vector<std::string>& message) const;
  // Prefill ranks whose sockets refuse connections are gone (liveness.h): the rooms they owe
  // fail and their fences are answered; one that listens again is routed to again.
  void ProbePeers(const std::vector<std::string>& peers);
  // Off the owner: refuses the connections the prefill rank at `endpoint` made so far
  // (Transport::RefuseWriter, decision 0021), saying `why` in the log. Whether at least one of
  // them can land nothing more now (false where the transport refuses nobody).
  bool RefuseWriter(const std::string& endpoint, const char* why);
  // --registry: publishes the descriptor if it changed (never waits for etcd).
  void PublishDescriptor();

  // --- decode_routing.cc --------------------------------------------------------------------
  absl::Status Expect(const v1::Expect& expect) override;
  // CachePD has no decode-to-prefill abort (§1.5): the room fails, and its pages are held
  // until the prefill ranks that may write it have fenced it.
  void AbortLocked(uint64_t room, const std::string& reason) override;
  absl::StatusOr<std::shared_ptr<PrefillNode>> NodeFor(const std::string& address);
  absl::StatusOr<std::string> EndpointFor(const std::string& address, PrefillNode& node,
                                          int dp_group, int rank);
  // In `address`'s strand: looks the node and its ranks up (HTTP, the first time), then
  // RouteLocked. `dp_group`: the engine's Expect.dp_group, checked against CachePD's rule
  // (plan::DpGroupOf).
  void Route(uint64_t room, const std::string& address, const layout::Manifest& manifest,
             std::optional<int> dp_group);
  // On the owner thread: the room's route when its node and every rank endpoint it needs were
  // looked up already (nothing to fetch), or why the engine's dp_group is refused; nullopt
  // otherwise.
  std::optional<absl::StatusOr<session::RoomRoute>> CachedRouteLocked(uint64_t room,
                                                                      const std::string& address,
                                                                      std::optional<int> dp_group);
  // On the owner thread: routes the room and sends its pre-allocations (or fails it).
  void RouteLocked(uint64_t room, session::RoomRoute route, const layout::Manifest& manifest);

  // --- room_digests.cc ----------------------------------------------------------------------
  // On the owner thread: keeps a room digest (control/wire/digest.h) for its room's Success.
  void KeepDigestLocked(const std::vector<std::string>& message, const std::string& host);
  // On the owner thread, --verify-digest: takes a Success that must wait for its digest check
  // (the check runs in a strand, and the Success is handled once it passed), or fails the room
  // whose kvrail prefill rank sent none. False: handle `message` as CachePD does.
  bool TakeForDigestLocked(const std::vector<std::string>& message);
  // Hashes what prefill rank `rank` wrote for `room` here (off the owner thread), compares with
  // `sent`, then handles `success` or fails the room naming both digests.
  void CheckLanded(std::vector<std::string> success, uint64_t room, uint32_t rank, uint64_t sent,
                   std::shared_ptr<const layout::Manifest> manifest,
                   std::shared_ptr<PrefillNode> node);
  // On the owner thread: a Success from a prefill rank for a room that is live here (what the
  // digest check and staging take); nullopt for any other message.
  struct LiveSuccess {
    uint64_t room = 0;
    uint32_t rank = 0;
    std::string bootstrap_address;
  };
  std::optional<LiveSuccess> LiveSuccessLocked(const std::vector<std::string>& message) const;
  // On the owner thread: the room's destination manifest and prefill node, which its landed
  // ranges need. When either is no longer known, fails the room ("<what>: the bytes prefill rank
  // N wrote <cannot>: the room's manifest is no longer known here") and returns false.
  bool LandingInputsLocked(const LiveSuccess& success, const std::string& what,
                           const std::string& cannot,
                           std::shared_ptr<const layout::Manifest>& manifest,
                           std::shared_ptr<PrefillNode>& node);
  // Where prefill rank `rank` of `node` lands its copies here (plan::LandingPlan), computed
  // once per node and rank. Asks the owner thread; call it off that thread.
  absl::StatusOr<std::shared_ptr<const plan::CopyPlan>> LandingPlanOf(PrefillNode& node,
                                                                      uint32_t rank);

  // --- arena_staging.cc ---------------------------------------------------------------------
  // On the owner thread: a Success from a prefill rank, checked as far as it must be (sender
  // proof, digest): on a staged arena its landed ranges go back to the arena first
  // (TakeForStagingLocked), then the ledger has it (HandleMessageLocked).
  void DeliverSuccessLocked(const std::vector<std::string>& message, const std::string& host);
  // On the owner thread, staged arena: takes a Success whose rank's landed ranges must be
  // copied from the mirror to the arena first (in a strand; StageLanded), or fails the room
  // whose ranges cannot be known. False: not a Success of a live room; handle it as CachePD
  // does.
  bool TakeForStagingLocked(const std::vector<std::string>& message);
  // Copies what prefill rank `rank` landed for `room` from the mirror to the arena (off the
  // owner thread), then handles `success`, or fails the room naming the staging error.
  void StageLanded(std::vector<std::string> success, uint64_t room, uint32_t rank,
                   std::shared_ptr<const layout::Manifest> manifest,
                   std::shared_ptr<PrefillNode> node);

  // --- row_staging.cc -----------------------------------------------------------------------
  // Row staging (SidecarOptions::row_staging_bytes; control/wire/row_staging.h): the memory
  // offered, cut into slots, and each slot offered, by room and prefill rank (its status rank),
  // until it comes back. Owner thread.
  struct OfferedSlot {
    uint64_t offset = 0;  // in row_staging_memory
    uint64_t bytes = 0;
    std::optional<bool> staged;  // the rank's answer ("staged": true), once it came
    bool scattering = false;     // its rows are being scattered into the pages (a strand)
  };
  std::optional<transport::SharedRegion> row_staging_memory;
  std::optional<StagingSlots> row_slots;
  std::map<uint64_t, std::map<uint32_t, OfferedSlot>> offered_slots;
  // The routes (bootstrap address, prefill rank) whose choice was logged: once each.
  std::set<std::pair<std::string, int>> row_staging_logged;
  // At attach: allocates and registers the memory (a staged or GPU arena gets none, logged).
  absl::Status StartRowStaging();
  // With the arena: forgets every slot and withdraws the memory.
  void StopRowStaging();
  // Whether a route lands rows apart where row staging serves it (SidecarOptions::row_staging).
  bool RouteStagesRowsLocked(const plan::CopyPlan& landing) const;
  // On the owner thread, before `m` goes: when it is a pre-allocation to a kvrail prefill rank
  // whose route stages rows and a slot is free, offers the rank the slot (owner proof, offer).
  void OfferRowStagingLocked(const session::OutboundMessage& m);
  // On the owner thread: a prefill rank's answer to its offer: "staged" is kept for its
  // Success; "in_place" gives the slot back.
  void KeepStagingAnswerLocked(const std::vector<std::string>& message, const std::string& host);
  // On the owner thread: takes a Success whose rank staged its rows (scattered in a strand,
  // ScatterStagedRows), fails the room whose rank did not answer its offer, drops a repeat
  // while the scatter runs. False: not such a Success.
  bool TakeForRowStagingLocked(const std::vector<std::string>& message);
  // Scatters the rows prefill rank `rank` staged for `room` (at `rows`, the slot's first byte)
  // into the pages (off the owner thread), gives the slot back, then goes on with `success`
  // (ContinueSuccessLocked) or fails the room naming the error.
  void ScatterStagedRows(std::vector<std::string> success, uint64_t room, uint32_t rank,
                         OfferedSlot slot, const uint8_t* rows,
                         std::shared_ptr<const layout::Manifest> manifest,
                         std::shared_ptr<PrefillNode> node);
  // On the owner thread: a Success whose rows are in the pages goes on: its digest check
  // (--verify-digest), then the ledger.
  void ContinueSuccessLocked(const std::vector<std::string>& message, const std::string& host);
  // On the owner thread: `room` ended and no write of it can land any more (`proven`), or may
  // (its fence was not proven): its slots come back, or are kept out of use for good.
  void ReturnRoomSlotsLocked(uint64_t room, bool proven);

  // --- registry_hooks.cc --------------------------------------------------------------------
  absl::Status StartRegistry() override;  // the publisher, under --registry
  // Revokes the lease: the entry goes at once, and its prefills drop it.
  void StopRegistry() override;

  // --- the hooks (sidecar_core.h), in decode_sidecar.cc -------------------------------------
  absl::Status CheckOptions() const override { return absl::OkStatus(); }
  zmq_auth::KeyRole KeyRole() const override { return zmq_auth::KeyRole::kDecode; }
  int KeyRank() const override { return options.tp_rank; }  // frame 7
  std::string KeyRankRule() const override { return "tp_rank"; }
  zmq_auth::KeyRole PeerKeyRole() const override { return zmq_auth::KeyRole::kPrefill; }
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

#endif  // KVRAIL_CONTROL_SIDECAR_DECODE_SIDECAR_H_
