// The room state of one decode rank (CACHEPD §1.3 D1 to D11, §1.5, §1.6, §3.4, §7.3): the
// registration sent once per prefill peer set, the pre-allocations of each room, the Success
// messages counted against the exact expected prefill rank set, timeouts and heartbeats.
//
// Pure: no sockets, threads or clocks. The caller does the bootstrap HTTP requests, plans the
// route (plan::Planner::TargetsFor), probes /health, feeds the results and the status frames
// in, and pushes the messages each call returns, in order, on the PUSH socket cached per
// endpoint (so a registration always precedes the pre-allocations that rely on it, §1.3).
//
// Thread-compatible: one owner calls it at a time.
#ifndef KVRAIL_CONTROL_SESSION_DECODE_ROOMS_H_
#define KVRAIL_CONTROL_SESSION_DECODE_ROOMS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
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
#include "control/plan/route.h"
#include "control/session/ended_rooms.h"
#include "control/session/room_output.h"
#include "control/session/room_transitions.h"
#include "control/session/timeouts.h"
#include "control/session/transfer_poll.h"
#include "control/wire/status.h"

namespace kvrail::session {

// Who this decode rank is: what its registration says (CACHEPD §3.2).
struct DecodeIdentity {
  std::string endpoint;       // host/IP of this rank's PULL socket (frame 1)
  uint16_t port = 0;          // that socket's port (frame 2)
  std::string session_id;     // data-plane session "<ip>:<port>" (frame 3)
  uint64_t arena_base = 0;    // the arena's base address, nonzero (frame 4)
  layout::Contract contract;  // sent in canonical form (frame 5); checks every manifest
  int decode_tp_size = 1;     // D (frame 6)
  int decode_tp_rank = 0;     // d (frame 7)
};

struct DecodeOptions {
  SessionTimeouts timeouts;
  // Read status frames as the reference does (wire::ParseStatusLenient: signs, spaces,
  // leading zeros, '_', 3 or 4 frames, frames after 6 ignored) instead of strictly
  // (wire::ParseStatus: 5, 6 or 7 canonical frames). Both read the 2026-09 frames 5 and 6
  // (CACHEPD §12.9).
  bool lenient_status = false;
  // The CachePD revision this decode is pinned to (SidecarOptions::cachepd_revision); nullopt:
  // both, each prefill node registered with in the form of its own layout (RoomRoute::revision).
  // Pinned, every registration is written in that form and a status must be in that form too
  // (the snapshot's reader takes exactly 5 frames), as a peer of that revision alone would.
  std::optional<layout::Revision> revision;
  // How long a failed room's pages wait for every prefill rank that may write them to answer
  // its fence request (wire/fence.h) before they are released as not provably safe.
  absl::Duration fence_wait = absl::Seconds(10);
  // The ended rooms remembered for the engine (Ended: Poll), the oldest forgotten first.
  size_t remembered_rooms = 65536;
};

// A prefill rank of the room's route and where its PULL socket is (from GET /route, §2.2).
struct PrefillTarget {
  int rank = 0;
  std::string endpoint;  // "tcp://<rank_ip>:<rank_port>"
};

// A room's route, once the bootstrap sync and the per-rank lookups are done (§1.3 D2 to D4).
struct RoomRoute {
  int dp_group = 0;             // room mod prefill_dp_size
  plan::DecodeTargets targets;  // E_d, Z_d, T_d of §6.5, from plan::Planner::TargetsFor(d)
  std::vector<PrefillTarget> endpoints;  // exactly one per rank of T_d, any order
  // The form of the prefill node's layout in its sync answer (CACHEPD §12.12): the registration
  // this decode sends its ranks is written in it, so that a snapshot-era prefill, which refuses
  // the 2026-09 contract, and a 2026-09 one, which refuses the snapshot's, both read it.
  layout::Revision revision = layout::kNewestRevision;
};

// What a call asks the caller to do.
struct DecodeOutput {
  // Registrations and pre-allocations to push, in order.
  std::vector<OutboundMessage> messages;
  // Room state changes, in the order they happened.
  std::vector<RoomEvent> events;
  // OnHealth only: bootstrap addresses just declared dead. Drop whatever is cached for them
  // (the parallel information of §2.3); their peer sets are already forgotten here.
  std::vector<std::string> dead_prefills;
  // Rooms that failed with Pages::kHeld whose pages are the engine's again.
  std::vector<PagesRelease> releases;
  // Prefill ranks (their CachePD endpoints) that fenced a room by disconnecting a data plane
  // that did not drain: writes they had handed over may still be on their way here. The caller
  // refuses each one's connections made so far (Transport::RefuseWriter), off the owner, and
  // then calls OnWriterRefused with whether it could; the rooms' pages stay held until then.
  std::vector<std::string> refuse_writers;
  // OnMessage only: why the status message was dropped or ignored, for the log. OK when it
  // was applied. A dropped message never touches any room.
  absl::Status rejected;
};

// A snapshot of one room, for tests and introspection.
struct DecodeRoomView {
  TransferPoll state = TransferPoll::kBootstrapping;
  std::string bootstrap_address;
  std::string failure_reason;
  FailureCause failure_cause = FailureCause::kNone;
  std::optional<std::vector<int>> expected_prefill_ranks;  // E_d; nullopt before the route
  std::vector<int> responders;                             // ranks whose Success counted, ascending
  // Published once the responders equal E_d (also on a room that failed meanwhile, as the
  // reference does): the token and ids from the first Success carrying each.
  std::optional<int64_t> bootstrap_token;
  std::optional<std::vector<int32_t>> spec_candidate_ids;
  std::optional<double> bootstrap_logprob;
  // The reference's cached-token table (CACHEPD §12.9): the maximum of 0 and every cached-token
  // count a Success from a rank of E_d carried so far, repeated Successes included; it goes on
  // rising after the room succeeded, but the Success event carries the value at completion.
  int64_t cached_tokens = 0;
};

class DecodeRooms {
 public:
  // Checks the identity by building its registration frames (wire::BuildRegistration), and
  // 1 <= D <= 1024, 0 <= d < D.
  static absl::StatusOr<DecodeRooms> Create(DecodeIdentity identity, DecodeOptions options = {});

  DecodeRooms(DecodeRooms&&) = default;
  DecodeRooms& operator=(DecodeRooms&&) = default;

  // D1: a new room, Bootstrapping, whose prefill node answers at `bootstrap_address`
  // ("host:port"). Fails (AlreadyExists) for a tracked room, (InvalidArgument) for a room
  // above 2^63-1.
  absl::StatusOr<DecodeOutput> BeginRoom(uint64_t room, absl::string_view bootstrap_address,
                                         absl::Time now);

  // D3 to D6: the room's route is known. Records E_d (the exact set of ranks whose Success the
  // room needs) and, unless this peer set (bootstrap address, DP group, T_d) was registered
  // before, returns the registration for every rank of T_d. The room becomes Bootstrapped.
  // A room that failed meanwhile stays Failed (reported nothing again: its one terminal event
  // went out) and nothing is sent. A route whose E_d holds a rank at an endpoint known gone
  // (OnPrefillGone) fails the room at once, naming it, and sends nothing.
  // Fails, changing nothing: NotFound for an untracked room; FailedPrecondition when the room
  // already has a route; InvalidArgument when E_d is empty, T_d is not the sorted union of
  // E_d and Z_d, Z_d is not empty off decode rank 0, or the endpoints are not one per T_d rank.
  absl::StatusOr<DecodeOutput> OnRoute(uint64_t room, RoomRoute route, absl::Time now);

  // D7 to D9: blocks are allocated. Returns the pre-allocation for every rank of T_d, the
  // canonical manifest for E_d and an empty one for Z_d (§3.3, §6.5); the room becomes
  // WaitingForInput and its waiting timeout starts. A room that failed meanwhile stays Failed
  // (reported nothing again) and nothing is sent. Fails, changing nothing: NotFound for an
  // untracked room; FailedPrecondition when the room has no route yet or already pre-allocated (its
  // state does not decide: a peer's status message may have raised it, §3.4 item 4);
  // InvalidArgument when the manifest fails §5.3 against this rank's contract.
  absl::StatusOr<DecodeOutput> OnAllocated(uint64_t room, const layout::Manifest& manifest,
                                           absl::Time now);

  // D10, D11: one status message from a prefill rank (§3.4). A malformed one is dropped; one
  // for an untracked room is ignored. Success from a rank of E_d counts once; from outside E_d,
  // or before the route, it fails the room. The room succeeds when the responders equal E_d
  // exactly; its event carries the token, the ids and the logprob from the first Success
  // carrying each, and the maximum cached-token count of every such Success (CACHEPD §12.9).
  // Failed fails the room (cause kPeerFailed, "it might be dead", as CachePD can say no more;
  // from a kvrail rank that sent its room outcome first, its own cause and "prefill rank N:
  // <its reason>"). Other codes are merged by the update rule (§7.1). A kvrail fence answer
  // (wire/fence.h) counts its rank as fenced for a room whose pages are held; a kvrail room
  // outcome (wire/outcome.h) from a rank of the room's T_d is kept for its Success or Failed.
  //
  // Failed means fenced, on this side too: a room that fails after its pre-allocations went out
  // is reported with Pages::kHeld, unless every rank of E_d already sent Success, and every
  // rank of E_d that has not is sent a fence request. The pages are released (releases) once
  // all of them answered, or unproven after fence_wait (Tick). A room that fails earlier, or a
  // Success, is reported with Pages::kReusable. CachePD has no such message (§1.5): only a
  // kvrail prefill answers; a tokenspeed one drops the request (§3.2.1).
  DecodeOutput OnMessage(absl::Span<const std::string> frames, absl::Time now);

  // A decode-local failure (§1.5 item 2: the bootstrap HTTP requests failed, a send failed,
  // ...). Unknown rooms are ignored; a failed room keeps its first reason.
  DecodeOutput Fail(uint64_t room, absl::string_view reason, absl::Time now,
                    FailureCause cause = FailureCause::kOther);

  // A staged arena (the sidecar's arena_staging.cc): a copy of what a prefill rank landed in the
  // host mirror back into `room`'s pages begins, before that rank's Success is handled. Failed
  // means fenced: while a copy into a room's pages runs, its Failed says the pages are held, and
  // their release waits for the room's last copy to return (EndStaging), whatever the fence
  // answers said. Not a live room: ignored.
  void BeginStaging(uint64_t room);
  // A copy into `room`'s pages returned: the release of its pages, when it waited for this, the
  // room's last copy running.
  DecodeOutput EndStaging(uint64_t room, absl::Time now);

  // The engine restarted and attached again: every room that has not ended fails with `reason`
  // (its pages held until fenced, as Fail).
  DecodeOutput FailAll(absl::string_view reason, absl::Time now);

  // Fails every room that has been waiting for its Success messages for waiting_timeout, and
  // releases, as not provably safe, the pages of rooms whose fence wait ran out.
  DecodeOutput Tick(absl::Time now);

  // The result of one /health probe of `bootstrap_address` (§1.6). A success resets the
  // failure count. At EffectiveHeartbeatMaxFailures consecutive failures the prefill node is
  // declared dead: its peer sets are forgotten (the next room registers again), every room of
  // it that has not reached Success fails, and the address is reported in dead_prefills.
  DecodeOutput OnHealth(absl::string_view bootstrap_address, bool ok, absl::Time now);

  // The prefill rank whose PULL socket is `endpoint` is gone (nobody listens there any more: its
  // process died), which CACHEPD's heartbeat cannot see while the node's bootstrap server lives.
  // Every room it still owes a Success fails, and its fences are answered: a process that is
  // gone writes nothing more. The caller probes (sidecar/liveness.h). The endpoint is
  // remembered as gone (GonePrefills; at most kMaxGonePrefills, the oldest forgotten first):
  // until it listens again, a room whose route expects a Success from it fails in OnRoute,
  // naming the rank, and nothing is sent to any rank of that route.
  DecodeOutput OnPrefillGone(absl::string_view endpoint, absl::Time now);
  // A probe of a gone prefill endpoint was accepted: a process listens there again.
  void OnPrefillListening(absl::string_view endpoint);

  // The caller refused the connections of the prefill rank at `endpoint` (`refused`), or could
  // not (its data plane lands nothing it could refuse: shared memory's stores), as a
  // DecodeOutput::refuse_writers asked. Its unproven fence answers count as proven where it
  // refused them: nothing it sent before can land any more. A fence whose answers are then all
  // in releases the room's pages.
  DecodeOutput OnWriterRefused(absl::string_view endpoint, bool refused, absl::Time now);
  // The prefill endpoints remembered as gone, to probe until they listen again; sorted.
  std::vector<std::string> GonePrefills() const;
  // Whether `endpoint` is remembered as gone (above).
  bool IsGone(absl::string_view endpoint) const { return gone_prefills_.contains(endpoint); }
  static constexpr size_t kMaxGonePrefills = 1024;
  // The prefill endpoints worth probing: those of rooms waiting for a Success, and of fences
  // waiting for an answer; sorted, distinct.
  std::vector<std::string> PrefillEndpoints() const;

  // Forgets the room (after the engine has seen its final state, §1.3 D11), and what was kept
  // with it (below). A fence still waiting for answers stays until it is released.
  void Free(uint64_t room);

  // --- what the sidecar keeps with a room, and which goes with it -------------------------

  // The room's destination manifest, which --verify-digest and a staged arena need once its
  // Successes come. NotFound for an untracked room (nothing kept).
  absl::Status KeepManifest(uint64_t room, std::shared_ptr<const layout::Manifest> manifest);
  // The manifest kept with the room; null when none was, or the room is not tracked.
  std::shared_ptr<const layout::Manifest> ManifestOf(uint64_t room) const;
  // The prefill rank of the room's route whose PULL socket is `endpoint` (a pre-allocation's
  // destination); nullopt for an untracked room, one with no route yet, or another endpoint.
  std::optional<int> RankAt(uint64_t room, const std::string& endpoint) const;
  // The room digest (wire/digest.h) a kvrail prefill rank sent right before its Success, kept
  // until that Success takes it (TakeDigest); a second one of the rank replaces the first.
  // NotFound for an untracked room, InvalidArgument for a rank outside the room's T_d (or a
  // room not routed yet, whose T_d is not known): nothing is kept, so a peer cannot grow a
  // room's entry past its prefill ranks.
  absl::Status KeepDigest(uint64_t room, int prefill_rank, uint64_t digest);
  // The digest prefill rank `prefill_rank` sent for `room`, forgotten as it is taken; nullopt
  // when none was kept.
  std::optional<uint64_t> TakeDigest(uint64_t room, int prefill_rank);

  // Forgets every registered peer set of `bootstrap_address`, so that the next room
  // registers again (for instance after sending to it failed).
  void ForgetPeerSets(absl::string_view bootstrap_address);

  // --- views ------------------------------------------------------------------------------

  // CachePD's state of the room (CACHEPD §7.1, as the reference's decode has it).
  std::optional<TransferPoll> State(uint64_t room) const;
  // What the engine is shown (Poll): State(), except kTransferring from the moment the room's
  // pre-allocations went out (a prefill rank may write its pages from then on) until it ends,
  // where CachePD's decode says WaitingForInput.
  std::optional<TransferPoll> EngineState(uint64_t room) const;
  std::optional<DecodeRoomView> Find(uint64_t room) const;
  size_t room_count() const { return rooms_.size(); }
  // The end of a room that ended (its one terminal event: remembered, and never made twice),
  // while it is among the newest DecodeOptions::remembered_rooms and its id was not used again
  // (BeginRoom); null otherwise.
  const EndedRoom* Ended(uint64_t room) const { return ended_.Find(room); }
  size_t EndedCount() const { return ended_.size(); }
  // State changes CACHEPD's update rule asked for that this role's transition table does not
  // list (room_transitions.h): not made. Zero unless kvrail has a bug; the room world checks.
  uint64_t unlisted_moves() const { return unlisted_moves_; }
  // Rooms whose pages wait for fence answers.
  size_t fence_count() const { return fences_.size(); }
  // The bootstrap addresses to probe: those of tracked rooms and registered peer sets, sorted.
  std::vector<std::string> BootstrapAddresses() const;
  // Whether a registration was sent for this peer set (§1.3 D5 cache key).
  bool IsRegistered(absl::string_view bootstrap_address, int dp_group,
                    absl::Span<const int> target_ranks) const;
  // The registration frames this rank sends (§3.2) to a prefill node of revision `form`: its
  // contract written in that form (§12.1). Fails when the contract cannot be written in it (a
  // snapshot form cannot carry a narrowed plan's resident_block_bytes).
  absl::StatusOr<std::vector<std::string>> registration_frames(
      layout::Revision form = layout::kNewestRevision) const;

 private:
  struct Room {
    TransferPoll state = TransferPoll::kBootstrapping;
    std::string bootstrap_address;
    std::string failure_reason;
    FailureCause failure_cause = FailureCause::kNone;
    bool routed = false;
    bool preallocated = false;             // OnAllocated ran; the waiting timeout runs
    std::vector<int> expected;             // E_d, ascending
    std::vector<int> dummies;              // Z_d, ascending
    std::vector<PrefillTarget> targets;    // T_d with endpoints, ascending rank
    std::vector<int> responders;           // ascending, distinct
    int staging = 0;                       // copies back into its pages running (BeginStaging)
    std::optional<int64_t> pending_token;  // from the first Success carrying one
    std::optional<std::vector<int32_t>> pending_spec_ids;
    std::optional<double> pending_logprob;  // from the first Success carrying one (§12.9)
    int64_t cached_tokens = 0;              // max over Successes of E_d ranks (§12.9)
    bool published = false;
    std::optional<int64_t> token;
    std::optional<std::vector<int32_t>> spec_ids;
    std::optional<double> logprob;
    int64_t published_cached_tokens = 0;
    absl::Time waiting_since;
    absl::Time success_at;  // when it became Success
    // kvrail prefill ranks' room outcomes (wire/outcome.h), by rank of T_d: what each wrote
    // here, or its own cause and reason, for the Success or Failed that follows it.
    struct Outcome {
      uint64_t bytes = 0;
      uint64_t copies = 0;
      std::string cause;
      std::string reason;
    };
    std::map<int, Outcome> outcomes;
    // Kept for the sidecar (KeepManifest, KeepDigest): they go with the room.
    std::shared_ptr<const layout::Manifest> manifest;
    std::map<int, uint64_t> digests;  // by prefill rank of T_d
  };
  // A failed room's pages, held until every rank that may write them answered its fence and
  // no copy back into them runs any more.
  struct Fence {
    std::vector<PrefillTarget> pending;  // ascending rank
    absl::Time started;
    std::vector<std::string> unproven;  // ranks that answered "unproven", for the reason
    // Ranks that answered "unproven" whose connections the caller is refusing (OnWriterRefused),
    // and those it refused, for the reason.
    std::vector<PrefillTarget> refusing;
    std::vector<std::string> refused;
    int staging = 0;  // copies into the pages still running (BeginStaging)
    // The release the fence's answers (or its wait) decided, held until `staging` is 0.
    std::optional<PagesRelease> release;
  };
  // (bootstrap address, DP group, comma list of T_d): the reference's registration cache key.
  using PeerSetKey = std::tuple<std::string, int, std::string>;

  DecodeRooms(DecodeIdentity identity, DecodeOptions options,
              absl::StatusOr<std::vector<std::string>> snapshot_frames,
              absl::StatusOr<std::vector<std::string>> frames_2026_09);

  void SetState(uint64_t room_id, Room& room, TransferPoll state, DecodeOutput& out);
  void OnFencedAnswer(absl::Span<const std::string> frames, absl::Time now, DecodeOutput& out);
  void OnRoomOutcome(absl::Span<const std::string> frames, DecodeOutput& out);
  void FailRoom(uint64_t room_id, Room& room, FailureCause cause, std::string reason,
                absl::Time now, DecodeOutput& out);
  void OnSuccess(uint64_t room_id, Room& room, wire::StatusMessage message, absl::Time now,
                 DecodeOutput& out);
  void ReportCurrent(uint64_t room_id, const Room& room, DecodeOutput& out) const;
  // The fence of `room_id` decided its pages' release: out now (true: the caller erases the
  // fence), or held in the fence while a copy into the pages runs (EndStaging sends it).
  bool Release(Fence& fence, PagesRelease release, DecodeOutput& out);
  // Every answer of the fence of `room_id` is in (none pending, no refusal running): its
  // release, proven unless a rank fenced unproven and its writer was not refused. `proven_why`
  // says why when proven. True: the caller erases the fence.
  bool ReleaseAnswered(uint64_t room_id, Fence& fence, std::string proven_why, absl::Time now,
                       DecodeOutput& out);

  DecodeIdentity identity_;
  DecodeOptions options_;
  // The registration in each form (§3.2, §12.1), or why the contract cannot be written in it.
  absl::StatusOr<std::vector<std::string>> snapshot_registration_;
  absl::StatusOr<std::vector<std::string>> registration_2026_09_;
  absl::flat_hash_map<uint64_t, Room> rooms_;
  absl::flat_hash_map<uint64_t, Fence> fences_;
  EndedRooms ended_;
  uint64_t unlisted_moves_ = 0;
  // The peer sets registered with, and the PULL endpoints of their ranks then (in target order):
  // a rank restarted on another endpoint, or gone from its own (OnPrefillGone), is a process
  // that never saw this decode's registration, and the next room registers again.
  std::map<PeerSetKey, std::vector<std::string>> registered_;
  absl::flat_hash_map<std::string, int> health_failures_;  // bootstrap address -> count
  // Prefill PULL endpoints whose socket refused connections, and since when (OnPrefillGone).
  absl::flat_hash_map<std::string, absl::Time> gone_prefills_;
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_DECODE_ROOMS_H_
