// The room state of one prefill rank (CACHEPD §1.3 to §1.5, §3.2.2, §3.3, §7.2, §11): decode
// registrations, pre-allocations collected per room, the engine's begin and ready signals, the
// copy work of a room, its transfers on the data plane until no write of it can land, and the
// status frames its decode ranks are sent. One entry per room holds all of it.
//
// Pure: no sockets, threads or clocks. The caller feeds it peer messages, engine signals,
// transfer outcomes and the time, and acts on what each call returns (PrefillOutput): push the
// messages in order, prepare and submit the transfers, cancel those it names, report the
// events. The actual copy expansion and data-plane transfer belong to the layers below
// (plan::CopyPlan, engine/transfer).
//
// A room's transfers (one per data destination for each work: one work in the default mode;
// with layer-wise streaming, CACHEPD §6.11, one per LayersReady that made new layers final, then
// the Ready's) go through one phase, TransferPhase (docs/ARCHITECTURE.md, "Failed means
// fenced"):
//
//   preparing --(a work's destinations prepared: TransfersPrepared)--> posting
//       |                                                                 |
//       +--(the room fails: abort, fence request, a failed preparation,---+--> fencing
//           a failed write)
//
//   posting --(every work handed out, the final one included, landed)--> the room's Success
//   fencing --(nothing of it posted, or every posted transfer's outcome came)--> its Failed
//
// A generation per work makes late work harmless: a preparation that finishes after its room
// failed submits nothing.
//
// Thread-compatible: one owner calls it at a time (one writer per room state, which avoids the
// reference's unlocked status race, CACHEPD §11.5).
#ifndef KVRAIL_CONTROL_SESSION_PREFILL_ROOMS_H_
#define KVRAIL_CONTROL_SESSION_PREFILL_ROOMS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/revision.h"
#include "control/plan/copy_plan.h"
#include "control/plan/fragment.h"
#include "control/plan/owner_filter.h"
#include "control/plan/planner.h"
#include "control/plan/stage_filter.h"
#include "control/session/ended_rooms.h"
#include "control/session/room_output.h"
#include "control/session/room_transitions.h"
#include "control/session/timeouts.h"
#include "control/session/transfer_poll.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"

namespace kvrail::session {

// Who this prefill rank is.
struct PrefillIdentity {
  int prefill_tp_size = 1;  // P: attention TP ranks of one DP group (of one stage, §10.1)
  int prefill_tp_rank = 0;  // p, in 0..P-1
  // The rank written in every status frame: the global prefill rank (stage * P + p, CACHEPD
  // §10.1) that decode ranks expect; -1 means prefill_tp_rank (one stage).
  int status_rank = -1;
  // The rank's own contract: the planner's prefill layout (§6.8) and the copies' source side.
  layout::Contract contract;
  // §12.6: the fields this rank's pipeline stage holds; nullopt = every field. Page-sharded
  // groups (§12.8) are the contract's own (GroupSpec::shard_count).
  std::optional<plan::StageFilter> stage;
};

struct PrefillOptions {
  SessionTimeouts timeouts;
  // The most bytes one room may copy to all its decode destinations together; 0 = no cap. A
  // room over the cap fails before anything is copied.
  uint64_t max_room_bytes = 0;
  // CACHEPD §11.1. When true, a registration for a stored session whose contract and TP
  // coordinates are unchanged but whose reply route or arena base changed is taken as a
  // restarted decode: the session's rooms fail (its old arena is gone) and the new
  // registration replaces the old one. When false, the reference's rule applies: the
  // registration is rejected as conflicting and the stored one is dropped (§3.2.2, §8).
  bool accept_restarted_peer = true;
  // The CachePD revision this prefill is pinned to (SidecarOptions::cachepd_revision); nullopt:
  // both, each decode answered in the form of its registration contract (CACHEPD §12.12).
  // Pinned, a registration whose contract is in the other form is rejected, as that revision's
  // reference rejects it (§12.11), so every peer is answered in the pinned form.
  std::optional<layout::Revision> revision;
  // kvrail: a pre-allocation from a session that pre-allocated the same blocks of the room
  // already is ignored, where the reference fails the room as a "duplicate" (§3.3 step 7): a
  // resend or replay must not abort a live room. The sidecar sets it; other blocks stay an error.
  bool ignore_repeated_preallocations = false;
  // kvrail: a pre-allocation naming a Decode session that is not registered changes no room and
  // stores nothing (it is answered Failed only where the reference would answer it, a session
  // whose registration was rejected), where the reference fails the room it names (§3.3): any
  // process that reaches the socket could otherwise abort any room, and grow the room table
  // with Failed rooms. The sidecar sets it (docs/SECURITY.md).
  bool unknown_sessions_change_nothing = false;
  // kvrail: right before each Success or Failed status, a room outcome (wire/outcome.h) to the
  // same destination: the bytes and copies this rank wrote to it, or the failure's cause and
  // reason, which CachePD's Failed cannot carry. The caller pushes it only to kvrail sessions
  // (a decode that is not kvrail is never sent one). The sidecar sets it.
  bool send_outcomes = false;
  // The most rooms tracked at once; a pre-allocation that would make another is answered
  // Failed and stores nothing. 0: no bound. Rooms the engine begins are not refused.
  size_t max_rooms = 0;
  // The most rooms one decode session may hold pre-allocations in at once; a pre-allocation
  // past it is answered Failed and stores nothing, so one decode cannot fill max_rooms and
  // lock the others out. 0: no bound.
  size_t max_rooms_per_session = 0;
  // The most decode sessions registered at once; a registration of a new session past it is
  // rejected (§3.2.3) and stores nothing. Sessions re-registering are not refused. 0: no bound.
  size_t max_registrations = 0;
  // The most rejected reply routes remembered (§3.2.3); the oldest is forgotten first.
  size_t max_remembered_rejections = 4096;
  // The ended rooms remembered for the engine (Ended: Poll, refusals), at least: the oldest is
  // forgotten first, a failed one not before failed_room_ttl (ended_rooms.h).
  size_t remembered_rooms = 65536;
};

// A decode rank's accepted registration (CACHEPD §3.2.2). Immutable once stored, and shared
// with the rooms and transfers that use it, so it outlives a later re-registration.
struct DecodePeer {
  wire::Registration registration;  // as parsed; contract_wire holds the bytes as sent
  layout::Contract contract;        // frame 5, parsed
  std::string canonical_contract;   // frame 5 re-serialised (§4.2)
  // Where status frames go: "tcp://<endpoint up to its first ':'>:<port>" (CACHEPD §3.4).
  std::string reply_endpoint;
  bool dummy = false;  // a rendezvous-only registration (§6.5): no copies, expects {0}
  // route[p] for a data registration (§6.8); empty for a whole-field copy (P == D) or a dummy.
  std::vector<plan::Fragment> fragments;
  // route[p]'s owner-filter decisions, one per page-sharded group (§12.7, §12.8); a dummy's
  // are all "none"; empty when no group is sharded.
  std::vector<plan::GroupOwnerFilter> owner_filters;
  // S_p, the decode ranks each room needs a pre-allocation from; {0} for a dummy. Its size is
  // the room's fan-out, Planner::RequiredPreallocations(p) (§6.5).
  std::vector<int> expected_decode_ranks;
  // The fragments bound to both contracts, planned once per registration; null for a dummy.
  std::shared_ptr<const plan::CopyPlan> copy_plan;
  // E_d, the prefill ranks the decode rank's route reads (§6.5): how many, and this rank's
  // place among them (ascending). 1 and 0 for a dummy.
  int route_sources = 1;
  int source_index = 0;
};

// One data destination of a room.
struct TransferDestination {
  std::shared_ptr<const DecodePeer> peer;            // route, arena base, contract, copy plan
  std::shared_ptr<const layout::Manifest> manifest;  // the decode's pre-allocated blocks
  uint64_t bytes = 0;  // the bytes peer->copy_plan copies for this room
};

// A room's copy work, for the transfer layer: expand each destination's copy plan over
// (source_manifest, destination manifest), then report TransfersPrepared (or
// PreparationFailed), submit the transfers it returns, and report each one's TransferOutcome.
struct TransferWork {
  uint64_t room = 0;
  uint64_t generation = 0;  // this work's, for TransfersPrepared and PreparationFailed
  std::shared_ptr<const layout::Manifest> source_manifest;
  // In the order the pre-allocations arrived (CACHEPD §6.9 "Issuing the descriptors").
  std::vector<TransferDestination> destinations;
  uint64_t total_bytes = 0;  // of this work's layers
  // Layer-wise streaming (CACHEPD §6.11, LayersReady): only the fields "layer.<N>.*" with N in
  // `layers` (plan::CopyPlan::ExpandLayers); the default range is every field. `final`: the
  // room's last work (its Ready's); the room is done once this and every earlier work of it
  // have landed.
  plan::CopyPlan::LayerRange layers;
  bool final = true;
};

// What the engine says when a room's cache is final (the default, non-layerwise mode: one final
// chunk after the forward pass, CACHEPD §1.3 P4, §1.4).
struct RoomReady {
  // The room's source blocks, built from the decode's (prefix_len, prompt_len). May be nullopt
  // only on a rank whose room has no data destination (a dummy rank).
  std::optional<layout::Manifest> source_manifest;
  int64_t bootstrap_token = -1;  // the first sampled token, or -1 for none
  std::optional<std::vector<int32_t>> spec_candidate_ids;  // nullopt (or empty) for none
  // The prompt tokens this rank served from its own prefix cache (CACHEPD §12.9 frame 5):
  // 0 <= cached_tokens <= the source manifest's prompt_len (2^48 without one).
  int64_t cached_tokens = 0;
  // The bootstrap token's log-probability (CACHEPD §12.9 frame 6); nullopt for none. Not NaN
  // and not +inf (what wire::ParseStatus refuses); -inf is allowed.
  std::optional<double> first_token_logprob;
};

// The checks PrefillRooms::Ready makes on what the engine says of `room` (InvalidArgument,
// naming the field): a token of -1 or more; 0 <= cached_tokens <= the source manifest's
// prompt_len (2^48 without one); a logprob that is not NaN or +inf (CACHEPD §12.9). A caller
// may run them first, to refuse a Ready before anything of the room is stored.
absl::Status CheckRoomReady(uint64_t room, const RoomReady& ready);

// What a call asks the caller to do.
struct PrefillOutput {
  // Status frames to push, in order (only Failed and Success are ever sent, §3.4).
  std::vector<OutboundMessage> messages;
  // Rooms whose copies may start now.
  std::vector<TransferWork> transfers;
  // Submitted transfers to cancel (their outcomes follow, once the transfer layer fenced them).
  std::vector<uint64_t> cancels;
  // Rooms whose fence began: they failed while their transfers were in flight (posted or being
  // prepared). Failed means fenced: until every transfer of the room reported its outcome the
  // room stays in its state, and no Failed is sent or reported.
  std::vector<uint64_t> fences;
  // Sessions whose registration a restarted decode replaced (§11.1), with the old registration's
  // reply endpoint: whatever the caller keeps for the old process (its data-plane link and
  // descriptor, its PUSH socket) belongs to nobody now.
  std::vector<std::pair<std::string, std::string>> replaced;
  // Room state changes, in the order they happened (see each method for extra reports).
  std::vector<RoomEvent> events;
  // OnMessage only: why the peer message was refused, for the log (it names the frame, field
  // or rule). OK when it was accepted. A refusal never touches rooms other than the one the
  // message names.
  absl::Status rejected;
};

// Where a room's transfers are (the diagram at the top of this file).
enum class TransferPhase {
  kPreparing,  // works handed out, none prepared yet; nothing submitted
  kPosting,    // transfers submitted (and perhaps more works being prepared)
  kFencing,    // the room failed: its posted transfers are cancelled, and it fails once they end
};

// A snapshot of one room, for tests and introspection.
struct PrefillRoomView {
  std::optional<TransferPoll> state;  // nullopt: pre-allocations are pending, no state yet
  std::string failure_reason;
  FailureCause failure_cause = FailureCause::kNone;
  std::vector<std::string> preallocated_sessions;  // arrival order; cleared on Success/abort
  bool begun = false;
  bool ready = false;
  // The room's transfers (TransferPhase): nullopt before its first work is handed out and after
  // no write of it can land any more.
  std::optional<TransferPhase> transfer;
  std::vector<uint64_t> preparing;     // generations of works handed out, not yet prepared
  std::vector<uint64_t> transfer_ids;  // submitted, not yet reported
  int64_t layers_final = 0;            // LayersReady: the layers final so far
  int64_t layers_sent = 0;             // the layers handed out as TransferWork
};

class PrefillRooms {
 public:
  // Checks 1 <= P <= 1024 and 0 <= p < P. The contract must be a validated one.
  static absl::StatusOr<PrefillRooms> Create(PrefillIdentity identity, PrefillOptions options = {});

  PrefillRooms(PrefillRooms&&) = default;
  PrefillRooms& operator=(PrefillRooms&&) = default;

  // --- peer messages ----------------------------------------------------------------------

  // One multipart message from the PULL socket (CACHEPD §3.2.1): a registration when frame 0
  // is "None", else a pre-allocation; a message without an ASCII frame 0 is only refused.
  //
  // Registration (§3.2.2, §3.2.3): the reply route (frames 1 to 3) is read first; when even it
  // is malformed the message is only refused. Otherwise a registration whose frames, contract,
  // planner decision (OnRegistration) or copy plan fail is rejected: every room holding a
  // pre-allocation from its session fails, the session is dropped and its route remembered,
  // so that its later pre-allocations can be answered with Failed. An identical
  // re-registration changes nothing; a different one follows PrefillOptions::
  // accept_restarted_peer. An accepted one clears the session's rejection and quarantine.
  //
  // A kvrail fence request (wire/fence.h: the decode gave the room up) fails the room, unless it
  // already ended, and is answered on the requester's registered route once no write of the
  // room can land any more: at once for a room that is unknown, ended or not yet moving, after
  // the fence for one in flight. A request from an unknown session is only refused.
  //
  // Pre-allocation (§3.3): frames 0 and 1 are read first; when they are malformed the message
  // is only refused. Then, in this order, the manifest must parse, the session be registered,
  // the manifest kind (empty = dummy) match the registration, the manifest pass §5.3 against
  // the decode's contract, the session not repeat in the room, and the room not exceed its
  // fan-out; when the fan-out is reached, all registrations must agree on decode_tp_size and
  // the expected rank set, and their ranks must be that set exactly. Any failure fails the
  // room ("invalid pre-allocation metadata: ...") and answers the sender with Failed on its
  // registered or rejected route. A room already Failed (or remembered as failed, §11.2) or
  // already Success answers the sender with Failed and changes nothing. The room becomes
  // Bootstrapped when its fan-out is complete, and its transfer starts if the engine is ready.
  //
  // Unlike the reference, a manifest that fails to parse is answered like any other rejection
  // (docs/cachepd-strictness.md), and a restarted decode is accepted (§11.1).
  PrefillOutput OnMessage(absl::Span<const std::string> frames, absl::Time now);

  // --- engine -----------------------------------------------------------------------------

  // The engine has the request (the reference's sender creation): the room becomes
  // Bootstrapping unless its pre-allocations already made it Bootstrapped (§1.3), and its
  // bootstrap timeout starts. Beginning a begun room changes nothing. The output holds one
  // event with the room's state after the call (also when it did not change). Fails, changing
  // nothing and reporting nothing: InvalidArgument for a room above 2^63-1; FailedPrecondition
  // for a room that already ended ("room N already failed: <reason>", EndedRoomError): its one
  // terminal event went out when it ended.
  // `announce` (the engine's Begin, which waits for the decodes' windows): the room's
  // Bootstrapped event is marked RoomEvent::announce, once, whether the room is Bootstrapped
  // already or becomes so later. Only the call that begins the room decides it.
  absl::StatusOr<PrefillOutput> BeginRoom(uint64_t room, absl::Time now, bool announce = false);

  // Whether the engine began `room` (BeginRoom) and it is still tracked.
  bool Begun(uint64_t room) const;

  // The decode windows of a begun room that is Bootstrapped (what its Bootstrapped event
  // carried); empty otherwise.
  std::vector<DecodeWindow> Windows(uint64_t room) const;

  // The room's cache is final. When the room is Bootstrapped the output holds its TransferWork
  // (or, for a room whose destinations are all dummies, Success at once, with no message);
  // otherwise the work is handed back by the call that completes its pre-allocations. Checked
  // before anything is copied, failing the room when broken: the source manifest against the
  // own contract (§5.3), each destination's prompt window and block counts against it, no
  // destination session in quarantine, and the total bytes against max_room_bytes.
  // Fails, changing nothing and reporting nothing, for a room that already ended
  // (FailedPrecondition, EndedRoomError: its true end and reason), a room never begun
  // (NotFound), a second Ready (FailedPrecondition), a token below -1, cached tokens out of
  // range or a NaN or +inf logprob (InvalidArgument, naming the field), or a source manifest
  // whose window [prefix_len, prompt_len) differs from a window a decode pre-allocated
  // (InvalidArgument naming both: the Bootstrapped event told the engine that window).
  absl::StatusOr<PrefillOutput> Ready(uint64_t room, RoomReady ready, absl::Time now);

  // Layer-wise streaming (CACHEPD §6.11, the whole prompt as one chunk): the fields
  // "layer.<N>.*" with N < `layers` of the room are final. When the room is Bootstrapped the
  // output holds a TransferWork (final = false) for the layers not handed out before;
  // otherwise the call that completes its pre-allocations hands back one for every layer
  // final by then. The room's Ready later sends the rest (final = true) and its Success goes
  // out, as in the default mode, only once everything has landed. The first call's
  // `source_manifest` is the room's; a later one (or the Ready's) may leave it out, or must
  // equal it. Checked as Ready checks the work, failing the room when broken.
  // Fails, changing nothing, for a room that already ended (as Ready), a source manifest whose
  // window differs from a decode's (as Ready), a room never begun (NotFound), one already Ready
  // (FailedPrecondition), a contract with a field not of the form layer.<N>.<suffix>
  // (FailedPrecondition), `layers` < 1 or below an earlier call's, or a source manifest that
  // differs from the first (InvalidArgument).
  absl::StatusOr<PrefillOutput> LayersReady(uint64_t room,
                                            std::optional<layout::Manifest> source_manifest,
                                            int64_t layers, absl::Time now);

  // --- transfer layer ---------------------------------------------------------------------
  //
  // How a room ends on the data plane. When every work handed out (the final one included)
  // has landed whole (flushed, "Success means landed"), the room becomes Success and each
  // destination is sent Success with this rank, the token and the speculative ids (§1.4, §3.4),
  // and, to a destination whose registration contract was in the 2026-09 form, the cached
  // tokens and the logprob in 7 frames (§12.9); the destinations are dropped. When the room
  // failed (fencing), it fails once nothing of it is posted any more, with its first failure's
  // reason, and every destination is sent Failed; a write's or a preparation's failure that came
  // first quarantines the session it blames for failed_session_ttl (§6.9, §7.4); an abort's
  // blames nobody. The room's terminal event carries the bytes that landed (0 unless Success),
  // the copies posted and the time from its first work.

  // The preparation of `work` (room, generation) is done, with one transfer per destination,
  // in `sessions` order. Returns their ids, to submit in that order (kPosting); none when the
  // room failed meanwhile (nothing of this work is submitted), when `sessions` is empty
  // (nothing to move), or when the generation is not one the room is preparing (stale). `out`
  // holds what that ended.
  std::vector<uint64_t> TransfersPrepared(uint64_t room, uint64_t generation,
                                          const std::vector<std::string>& sessions, absl::Time now,
                                          PrefillOutput& out);

  // The preparation of `generation` failed: the room fails with "CachePD transfer failed:
  // <reason>" and `cause`, blaming `blame` (empty: nobody). Nothing when the generation is not
  // one the room is preparing.
  PrefillOutput PreparationFailed(uint64_t room, uint64_t generation, absl::string_view reason,
                                  absl::string_view blame, FailureCause cause, absl::Time now);

  // After the ids from TransfersPrepared were submitted, if the room's FailingFlag was set once
  // every Submit had returned: cancels them (PrefillOutput::cancels). A room whose flag was still
  // clear then needs no call: its failure, later, cancels them itself.
  PrefillOutput TransfersSubmitted(uint64_t room);

  // A submitted transfer's outcome (fenced when it failed): `copies` it posted, and whether
  // its fence proved that no write of it lands any more (engine/transfer RoomOutcome::
  // fence_proven; false: the room's fence answers to that transfer's destination session say
  // so; a sibling's session whose own fences proved it is answered proven). A failure fails the
  // room (its siblings are cancelled), blaming `blame` (the caller's choice: nobody for a cancel);
  // the room ends with its last outcome. Nothing for an id that is not in flight.
  PrefillOutput TransferOutcome(uint64_t transfer_id, const absl::Status& status,
                                absl::string_view blame, absl::Time now, bool fence_proven = true,
                                uint64_t copies = 0);

  // The destination session of a transfer in flight, or empty.
  std::string SessionOfTransfer(uint64_t transfer_id) const;
  // A flag that turns true once `room` is fencing, for a thread preparing its work to read
  // without asking the owner (a preparation of a failed room is moot); null for a room with no
  // transfer. The one thing of this table another thread reads.
  std::shared_ptr<const std::atomic<bool>> FailingFlag(uint64_t room) const;
  // Rooms with transfers (TransferPhase), and transfers submitted and not yet reported.
  size_t rooms_transferring() const { return rooms_transferring_; }
  size_t transfers_in_flight() const { return transfer_owners_.size(); }

  // `abort_room` (§1.5): the room fails with `reason` and every non-dummy destination that has
  // pre-allocated it is sent Failed; its destinations are dropped. A room whose transfer is in
  // flight is fenced first (PrefillOutput::fences). An unknown room makes no state (NotFound
  // in `rejected`): an engine's aborts cannot grow the table. Failing a failed room changes
  // nothing (the first reason stays).
  PrefillOutput Abort(uint64_t room, absl::string_view reason, absl::Time now);

  // The decode behind `session_id` is gone (its handshake endpoint refuses connections, say):
  // its rooms fail as for a rejected registration (fenced first when in flight), and its
  // registration, rejection and quarantine are forgotten. Returns its reply endpoint, or
  // nullopt when the session was not registered.
  // `cause`: kPeerFailed (its endpoint refuses, is silent, answers for another process) or
  // kExpired (its registry entry expired).
  std::optional<std::string> DropSession(absl::string_view session_id, absl::string_view reason,
                                         absl::Time now, PrefillOutput& out,
                                         FailureCause cause = FailureCause::kPeerFailed);

  // The engine restarted and attached again: every room it had begun and that has not ended
  // fails with `reason` (fenced first when in flight, as Abort). Rooms only pre-allocated by
  // decodes stay: the new engine may begin them.
  PrefillOutput AbortBegunRooms(absl::string_view reason, absl::Time now);

  // Forgets the room (the reference's discard_room, after the engine has seen its final
  // state); its end stays remembered (Ended). A room with transfers has not ended: it is not
  // freed.
  void Free(uint64_t room, absl::Time now);

  // --verify-digest: the room digest (wire/digest.h) of what the room wrote to the destination
  // whose reply endpoint is `reply_endpoint`, kept with the room until the Success to that
  // endpoint takes it (TakeSentDigest), and gone with the room (Free). NotFound for an untracked
  // room; InvalidArgument for an endpoint none of its destinations has.
  absl::Status KeepSentDigest(uint64_t room, absl::string_view reply_endpoint, uint64_t digest);
  // The digest kept for `reply_endpoint`, forgotten as it is taken; nullopt when none was.
  std::optional<uint64_t> TakeSentDigest(uint64_t room, absl::string_view reply_endpoint);

  // Row staging (wire/row_staging.h): the answer to the staging offer of the destination whose
  // reply endpoint is `reply_endpoint`, true when the room's rows to it went to the offered slot,
  // false when into its pages; kept and taken as the digest is (KeepSentDigest), with the same
  // errors.
  absl::Status KeepStagingAnswer(uint64_t room, absl::string_view reply_endpoint, bool staged);
  std::optional<bool> TakeStagingAnswer(uint64_t room, absl::string_view reply_endpoint);

  // Expires what is due at `now`: begun rooms Bootstrapping for bootstrap_timeout; rooms never
  // begun whose first pre-allocation is unmatched_preallocation_timeout old (§11.2); both fail
  // like Abort. Also forgets remembered failed rooms and quarantines that have run out.
  PrefillOutput Tick(absl::Time now);

  // --- views ------------------------------------------------------------------------------

  std::optional<TransferPoll> State(uint64_t room) const;
  std::optional<PrefillRoomView> Find(uint64_t room) const;
  // Rooms in play: begun, pre-allocated or transferring, not yet ended and freed.
  size_t room_count() const;
  // The ended rooms remembered (ended_rooms.h): the newest PrefillOptions::remembered_rooms,
  // and each failed one for failed_room_ttl (CACHEPD §11.2), to answer a late pre-allocation with
  // Failed; a bounded memory, not rooms in play. Their ends, and how many of them failed.
  const EndedRoom* Ended(uint64_t room) const { return ended_.Find(room); }
  size_t EndedCount() const { return ended_.size(); }
  // State changes CACHEPD's update rule asked for that this role's transition table does not
  // list (room_transitions.h): not made. Zero unless kvrail has a bug; the room world checks.
  uint64_t unlisted_moves() const { return unlisted_moves_; }
  size_t RememberedFailedCount() const { return ended_.failed(); }
  size_t registration_count() const { return registrations_.size(); }

  // The stored registration of `session_id`, or null.
  std::shared_ptr<const DecodePeer> Registration(absl::string_view session_id) const;
  // Every stored registration, by session id.
  std::vector<std::shared_ptr<const DecodePeer>> Registrations() const;
  // Remembered routes of rejected sessions (§3.2.3), by session id.
  std::vector<std::pair<std::string, wire::ReplyRoute>> RejectedSessions() const;
  // Sessions in quarantine at `now`, sorted.
  std::vector<std::string> QuarantinedSessions(absl::Time now) const;

  const PrefillIdentity& identity() const { return identity_; }

 private:
  struct Destination {
    std::shared_ptr<const DecodePeer> peer;
    std::shared_ptr<const layout::Manifest> manifest;  // null for a dummy
  };
  // A room's transfers, from its first work handed out until no write of it can land any more.
  struct Transfers {
    explicit Transfers(absl::Time began) : started(began) {}
    TransferPhase phase = TransferPhase::kPreparing;
    std::set<uint64_t> preparing;  // generations of works being prepared
    bool final = false;            // the last work was handed out
    std::vector<uint64_t> ids;     // submitted (or being submitted), not yet reported
    std::string blame;   // fencing: the session whose failure it was (quarantined), or empty
    uint64_t bytes = 0;  // handed out, every work's
    uint64_t copies = 0;
    std::map<std::string, uint64_t> copies_by_session;
    absl::Time started;
    // Set when the phase becomes kFencing (FailingFlag).
    std::shared_ptr<std::atomic<bool>> failing = std::make_shared<std::atomic<bool>>(false);
  };
  struct Room {
    std::optional<TransferPoll> state;
    std::string failure_reason;
    FailureCause failure_cause = FailureCause::kNone;
    std::vector<Destination> destinations;
    bool begun = false;
    // Begun with BeginRoom's `announce`, and its Bootstrapped event not marked yet.
    bool announce = false;
    absl::Time begun_at;
    absl::Time first_seen;
    // Set on a Failed room nobody holds (never begun, so never freed): forgotten at this time.
    std::optional<absl::Time> forget_at;
    std::optional<RoomReady> ready;
    // LayersReady: the layers the engine said are final, those handed out as work, and the
    // source manifest its first call gave.
    int64_t layers_final = 0;
    int64_t layers_sent = 0;
    std::shared_ptr<const layout::Manifest> layer_source;
    bool transfer_started = false;  // the final work (the Ready's) was handed out
    // From the first work handed out until no write of the room can land any more.
    std::optional<Transfers> transfers;
    // The destination sessions of its transfers whose fence could not prove that no write of
    // them lands any more (a transfer writes one session's memory only): a fence request of the
    // room from one of them is answered unproven, from any other session proven.
    std::set<std::string> unproven_sessions;
    // The bytes handed out as work to each destination session, for its room outcome.
    absl::flat_hash_map<std::string, uint64_t> bytes_by_session;
    // Decode sessions that asked for a fence of the room (wire/fence.h), answered once fenced.
    std::vector<std::string> fence_waiters;
    // --verify-digest: by destination reply endpoint, until its Success goes (KeepSentDigest).
    absl::flat_hash_map<std::string, uint64_t> sent_digests;
    // Row staging: by destination reply endpoint, until its Success goes (KeepStagingAnswer).
    absl::flat_hash_map<std::string, bool> staging_answers;
  };
  // The room `room_id` with a destination at `reply_endpoint`: NotFound for an untracked room,
  // InvalidArgument for an endpoint none of its destinations has.
  absl::StatusOr<Room*> DestinationRoom(uint64_t room_id, absl::string_view reply_endpoint);
  // What a room keeps per destination until the Success to it (digests, staging answers):
  // kept in the room's map `kept` (DestinationRoom's errors), and taken from it.
  template <typename T>
  absl::Status KeepFor(uint64_t room_id, absl::string_view reply_endpoint,
                       absl::flat_hash_map<std::string, T> Room::*kept, T value);
  template <typename T>
  std::optional<T> TakeFor(uint64_t room_id, absl::string_view reply_endpoint,
                           absl::flat_hash_map<std::string, T> Room::*kept);

  struct PlannerKey {
    int decode_tp_size;
    std::string canonical_contract;
    template <typename H>
    friend H AbslHashValue(H h, const PlannerKey& key) {
      return H::combine(std::move(h), key.decode_tp_size, key.canonical_contract);
    }
    friend bool operator==(const PlannerKey& a, const PlannerKey& b) {
      return a.decode_tp_size == b.decode_tp_size && a.canonical_contract == b.canonical_contract;
    }
  };

  PrefillRooms(PrefillIdentity identity, PrefillOptions options);

  void AddDestination(Room& room, Destination destination);
  void DropDestinations(Room& room);
  size_t RoomsOfSession(const std::string& session_id) const;

  void OnRegistration(absl::Span<const std::string> frames, absl::Time now, PrefillOutput& out);
  void OnPreallocation(absl::Span<const std::string> frames, absl::Time now, PrefillOutput& out);
  void OnFenceRequest(absl::Span<const std::string> frames, absl::Time now, PrefillOutput& out);
  void AnswerFence(uint64_t room, absl::string_view session_id, bool proven,
                   PrefillOutput& out) const;
  // The room's transfers fail (phase kFencing) with `reason` and `cause`, blaming `blame`
  // (empty: nobody), unless they are fencing already (the first failure stays); what is posted
  // is cancelled, and the room ends now when nothing is.
  void FenceTransfers(uint64_t room_id, Room& room, FailureCause cause, std::string reason,
                      std::string blame, absl::Time now, PrefillOutput& out);
  // Ends the room's transfers when nothing of it can write any more and nothing is left to
  // send: fencing with nothing posted, or every work handed out, prepared and landed.
  void EndTransfersIfDone(uint64_t room_id, Room& room, absl::Time now, PrefillOutput& out);
  // The room's transfers ended: Success when they landed, else Failed (answering its fence
  // requests).
  void EndTransfers(uint64_t room_id, Room& room, absl::Time now, PrefillOutput& out);
  absl::StatusOr<std::shared_ptr<const DecodePeer>> Admit(const wire::ReplyRoute& route,
                                                          absl::Span<const std::string> frames);
  absl::StatusOr<std::shared_ptr<const plan::Planner>> PlannerFor(
      int decode_tp_size, const std::string& canonical_contract,
      const layout::Contract& decode_contract);
  // `form`: the status form the rejected peer is answered in (its contract's revision, or the
  // newest when its contract did not parse).
  void RejectRegistration(const wire::ReplyRoute& route, wire::StatusForm form,
                          const absl::Status& error, absl::Time now, PrefillOutput& out);
  void AcceptRegistration(std::shared_ptr<const DecodePeer> peer);
  void AbortRoomsOfSession(absl::string_view session_id, FailureCause cause,
                           absl::string_view reason, absl::Time now, PrefillOutput& out);
  void RejectPreallocation(uint64_t room, absl::string_view session_id, const absl::Status& error,
                           absl::Time now, PrefillOutput& out);
  absl::Status Collect(const Room& room, const DecodePeer& peer) const;
  void ReplyFailed(uint64_t room, absl::string_view session_id, PrefillOutput& out) const;
  // Sends `status` to `endpoint` in `form` (CACHEPD §3.4, §12.9). A Success carries `ready`'s
  // token, ids, cached tokens and logprob; a Failed (ready null) -1, none, 0 and none.
  void SendStatus(uint64_t room, const std::string& endpoint, wire::StatusForm form,
                  TransferPoll status, const RoomReady* ready, PrefillOutput& out) const;
  // send_outcomes: the room outcome (wire/outcome.h) that goes right before a status.
  void SendOutcome(uint64_t room, const std::string& endpoint, uint64_t bytes, uint64_t copies,
                   FailureCause cause, const std::string& reason, PrefillOutput& out) const;
  // A terminal state is remembered (ended_) and reported once; a room remembered already
  // reports nothing.
  void SetState(uint64_t room_id, Room& room, TransferPoll state, absl::Time now,
                PrefillOutput& out);
  // Each data destination's window, in the order they pre-allocated.
  static std::vector<DecodeWindow> WindowsOf(const Room& room);
  // Gives a Bootstrapped `event` of `room` its windows, and its announce mark if it is owed.
  static void FillBootstrapped(Room& room, RoomEvent& event);
  void AbortRoom(uint64_t room_id, Room& room, FailureCause cause, std::string reason,
                 absl::Time now, PrefillOutput& out);
  void MaybeStartTransfer(uint64_t room_id, Room& room, absl::Time now, PrefillOutput& out);
  absl::StatusOr<TransferWork> BuildTransfer(uint64_t room_id, const Room& room,
                                             const layout::Manifest* source,
                                             plan::CopyPlan::LayerRange layers,
                                             absl::Time now) const;
  bool Quarantined(absl::string_view session_id, absl::Time now) const;
  // Whether the room reached Success or Failed (its one terminal event went out).
  static bool Ended(const Room& room);
  // The refusal of an engine call about a room that ended (EndedRoomError), or OK.
  absl::Status EndedRefusal(uint64_t room_id) const;
  // A source manifest whose window [prefix_len, prompt_len) differs from a destination's
  // pre-allocated one: InvalidArgument naming both (a Ready or LayersReady is refused with it).
  static absl::Status CheckWindows(uint64_t room_id, const Room& room,
                                   const layout::Manifest& source);

  PrefillIdentity identity_;
  PrefillOptions options_;
  absl::flat_hash_map<uint64_t, Room> rooms_;
  // Rooms holding a pre-allocation of each session (max_rooms_per_session); kept by
  // AddDestination and DropDestinations, the only code that changes a room's destinations.
  absl::flat_hash_map<std::string, size_t> session_rooms_;
  absl::flat_hash_map<std::string, std::shared_ptr<const DecodePeer>> registrations_;
  // A rejected registration's reply route, and the status form it is answered in (CACHEPD §12.9).
  struct Rejection {
    wire::ReplyRoute route;
    wire::StatusForm form = wire::StatusForm::k2026_09;
  };
  absl::flat_hash_map<std::string, Rejection> rejected_;
  std::deque<std::string> rejected_order_;                   // oldest first, for the bound
  absl::flat_hash_map<std::string, absl::Time> quarantine_;  // session -> end of quarantine
  absl::flat_hash_map<PlannerKey, std::shared_ptr<const plan::Planner>> planners_;
  // Transfers submitted and not yet reported: their room and destination session.
  struct TransferOwner {
    uint64_t room = 0;
    std::string session;
  };
  absl::flat_hash_map<uint64_t, TransferOwner> transfer_owners_;
  EndedRooms ended_;
  uint64_t unlisted_moves_ = 0;
  size_t rooms_transferring_ = 0;  // rooms whose `transfers` is set
  uint64_t next_generation_ = 1;
  uint64_t next_transfer_id_ = 1;
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_PREFILL_ROOMS_H_
