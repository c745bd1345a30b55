#include "control/session/decode_rooms.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/plan/planner.h"
#include "control/wire/fence.h"
#include "control/wire/limits.h"
#include "control/wire/outcome.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "control/wire/status.h"
#include "engine/base/error.h"

namespace kvrail::session {
namespace {

// An owned copy (spelled as a two-argument constructor: a one-argument one reads as a cast).
std::string Owned(absl::string_view text) { return std::string(text.data(), text.size()); }

// "prefill rank <r> at <endpoint>", as reasons and logs name a rank.
std::string Describe(const PrefillTarget& target) {
  return absl::StrCat("prefill rank ", target.rank, " at ", target.endpoint);
}

std::string RankList(absl::Span<const int> ranks) {
  return absl::StrCat("{", absl::StrJoin(ranks, ","), "}");
}

bool SortedDistinct(const std::vector<int>& ranks) {
  return std::adjacent_find(ranks.begin(), ranks.end(), [](int a, int b) { return a >= b; }) ==
         ranks.end();
}

}  // namespace

absl::StatusOr<DecodeRooms> DecodeRooms::Create(DecodeIdentity identity, DecodeOptions options) {
  if (identity.decode_tp_size < 1 || identity.decode_tp_size > plan::kMaxTpSize) {
    return absl::InvalidArgumentError(absl::StrCat("decode TP size ", identity.decode_tp_size,
                                                   " is outside 1..", plan::kMaxTpSize));
  }
  if (identity.decode_tp_rank < 0 || identity.decode_tp_rank >= identity.decode_tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("decode TP rank ", identity.decode_tp_rank,
                                                   " is outside 0..", identity.decode_tp_size - 1));
  }
  // Both forms up front: which one a prefill node reads is known only once its sync answer is.
  auto frames_in = [&identity](layout::Revision form) -> absl::StatusOr<std::vector<std::string>> {
    wire::Registration registration;
    registration.endpoint = identity.endpoint;
    registration.port = identity.port;
    registration.session_id = identity.session_id;
    registration.arena_base = identity.arena_base;
    KVRAIL_ASSIGN_OR_RETURN(registration.contract_wire,
                            layout::SerializeContract(identity.contract, form));
    registration.decode_tp_size = static_cast<uint32_t>(identity.decode_tp_size);
    registration.decode_tp_rank = static_cast<uint32_t>(identity.decode_tp_rank);
    return wire::BuildRegistration(registration);
  };
  absl::StatusOr<std::vector<std::string>> snapshot = frames_in(layout::Revision::kSnapshot);
  absl::StatusOr<std::vector<std::string>> newest = frames_in(layout::Revision::k2026_09);
  // A contract neither form can carry is refused now; one that only one form can carry fails
  // the rooms routed to a node of the other revision, each with the reason (OnRoute).
  if (!snapshot.ok() && !newest.ok()) return newest.status();
  if (options.revision.has_value()) {
    const auto& pinned = *options.revision == layout::Revision::kSnapshot ? snapshot : newest;
    if (!pinned.ok()) return pinned.status();
  }
  return DecodeRooms(std::move(identity), options, std::move(snapshot), std::move(newest));
}

DecodeRooms::DecodeRooms(DecodeIdentity identity, DecodeOptions options,
                         absl::StatusOr<std::vector<std::string>> snapshot_frames,
                         absl::StatusOr<std::vector<std::string>> frames_2026_09)
    : identity_(std::move(identity)),
      options_(options),
      snapshot_registration_(std::move(snapshot_frames)),
      registration_2026_09_(std::move(frames_2026_09)),
      ended_(options.remembered_rooms) {}

absl::StatusOr<std::vector<std::string>> DecodeRooms::registration_frames(
    layout::Revision form) const {
  return form == layout::Revision::kSnapshot ? snapshot_registration_ : registration_2026_09_;
}

absl::StatusOr<DecodeOutput> DecodeRooms::BeginRoom(uint64_t room_id,
                                                    absl::string_view bootstrap_address,
                                                    absl::Time now) {
  if (room_id > wire::kMaxRoom) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, " is above 2^63-1 (CACHEPD Terminology)"));
  }
  if (rooms_.contains(room_id)) {
    return absl::AlreadyExistsError(absl::StrCat("room ", room_id, " is already tracked"));
  }
  if (fences_.contains(room_id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("room ", room_id, " failed earlier and its pages are still held by a fence"));
  }
  ended_.Forget(room_id);  // a room id used again: a new room, with its own end
  Room& room = rooms_[room_id];
  room.bootstrap_address = Owned(bootstrap_address);
  DecodeOutput out;
  ReportCurrent(room_id, room, out);
  return out;
}

absl::StatusOr<DecodeOutput> DecodeRooms::OnRoute(uint64_t room_id, RoomRoute route,
                                                  absl::Time now) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " is not tracked"));
  }
  Room& room = found->second;
  DecodeOutput out;
  if (room.state == TransferPoll::kFailed) return out;  // its one Failed went out already
  if (room.routed) {
    return absl::FailedPreconditionError(absl::StrCat("room ", room_id, " already has a route"));
  }
  const plan::DecodeTargets& targets = route.targets;
  if (targets.expected_prefill_ranks.empty() || !SortedDistinct(targets.expected_prefill_ranks) ||
      !SortedDistinct(targets.dummy_tp_ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, ": E_d ", RankList(targets.expected_prefill_ranks),
                     " must be non-empty, and E_d and Z_d ascending (CACHEPD §6.5)"));
  }
  if (!targets.dummy_tp_ranks.empty() && identity_.decode_tp_rank != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, ": only decode rank 0 has dummy targets (CACHEPD §6.5)"));
  }
  std::vector<int> union_ranks;
  std::set_union(targets.expected_prefill_ranks.begin(), targets.expected_prefill_ranks.end(),
                 targets.dummy_tp_ranks.begin(), targets.dummy_tp_ranks.end(),
                 std::back_inserter(union_ranks));
  if (union_ranks != targets.target_tp_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "room ", room_id, ": T_d ", RankList(targets.target_tp_ranks),
        " is not the sorted union of E_d and Z_d ", RankList(union_ranks), " (CACHEPD §6.5)"));
  }
  std::vector<PrefillTarget> endpoints = std::move(route.endpoints);
  std::sort(endpoints.begin(), endpoints.end(),
            [](const PrefillTarget& a, const PrefillTarget& b) { return a.rank < b.rank; });
  bool one_each = endpoints.size() == union_ranks.size();
  for (size_t i = 0; one_each && i < endpoints.size(); ++i) {
    one_each = endpoints[i].rank == union_ranks[i] && !endpoints[i].endpoint.empty();
  }
  if (!one_each) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, ": needs exactly one non-empty endpoint per target rank ",
                     RankList(union_ranks)));
  }

  for (const PrefillTarget& target : endpoints) {
    auto gone = gone_prefills_.find(target.endpoint);
    if (gone == gone_prefills_.end() ||
        !std::binary_search(targets.expected_prefill_ranks.begin(),
                            targets.expected_prefill_ranks.end(), target.rank)) {
      continue;
    }
    // Nothing is sent to any rank: the live ones would copy a room that cannot succeed.
    FailRoom(room_id, room, FailureCause::kPeerFailed,
             absl::StrCat(Describe(target), " is gone (its CachePD socket refused connections ",
                          absl::FormatDuration(now - gone->second),
                          " ago, and has not listened since): the room is not routed to it"),
             now, out);
    return out;
  }
  const layout::Revision form = options_.revision.value_or(route.revision);
  absl::StatusOr<std::vector<std::string>> registration = registration_frames(form);
  if (!registration.ok()) {
    return MakeError(ErrorCategory::kIncompatiblePeer,
                     absl::StrCat("room ", room_id, ": the prefill node speaks CachePD ",
                                  layout::RevisionName(form),
                                  ", whose contract form cannot carry this decode's contract (",
                                  registration.status().message(), ") (CACHEPD §12.11)"));
  }
  room.routed = true;
  room.expected = targets.expected_prefill_ranks;
  room.dummies = targets.dummy_tp_ranks;
  room.targets = std::move(endpoints);
  PeerSetKey key{room.bootstrap_address, route.dp_group,
                 absl::StrJoin(targets.target_tp_ranks, ",")};
  std::vector<std::string> registered_with;
  for (const PrefillTarget& target : room.targets) registered_with.push_back(target.endpoint);
  auto [peer_set, first_time] = registered_.try_emplace(std::move(key), registered_with);
  if (first_time || peer_set->second != registered_with) {
    // Every rank again, also those that kept their endpoint: a registration a prefill already
    // holds is accepted as it is (PrefillRooms: the same registration is a no-op).
    peer_set->second = std::move(registered_with);
    for (const PrefillTarget& target : room.targets) {
      out.messages.push_back(OutboundMessage{target.endpoint, *registration});
    }
  }
  SetState(room_id, room, TransferPoll::kBootstrapped, out);
  return out;
}

absl::StatusOr<DecodeOutput> DecodeRooms::OnAllocated(uint64_t room_id,
                                                      const layout::Manifest& manifest,
                                                      absl::Time now) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " is not tracked"));
  }
  Room& room = found->second;
  DecodeOutput out;
  if (room.state == TransferPoll::kFailed) return out;  // its one Failed went out already
  if (!room.routed || room.preallocated) {
    return absl::FailedPreconditionError(absl::StrCat(
        "room ", room_id,
        room.routed ? " has already pre-allocated" : " has no route yet: call OnRoute first"));
  }
  absl::Status valid = layout::ValidateManifest(manifest, identity_.contract);
  if (!valid.ok()) return AddContext(valid, absl::StrCat("room ", room_id, " manifest"));
  KVRAIL_ASSIGN_OR_RETURN(std::string manifest_wire, layout::SerializeManifest(manifest));

  for (const PrefillTarget& target : room.targets) {
    const bool dummy = std::binary_search(room.dummies.begin(), room.dummies.end(), target.rank);
    wire::Preallocation preallocation{room_id, identity_.session_id,
                                      dummy ? std::string() : manifest_wire};
    KVRAIL_ASSIGN_OR_RETURN(std::vector<std::string> frames,
                            wire::BuildPreallocation(preallocation));
    out.messages.push_back(OutboundMessage{target.endpoint, std::move(frames)});
  }
  room.preallocated = true;
  room.waiting_since = now;
  SetState(room_id, room, TransferPoll::kWaitingForInput, out);
  return out;
}

DecodeOutput DecodeRooms::OnMessage(absl::Span<const std::string> frames, absl::Time now) {
  DecodeOutput out;
  if (wire::IsFencedAnswer(frames)) {
    OnFencedAnswer(frames, now, out);
    return out;
  }
  if (wire::IsRoomOutcome(frames)) {
    OnRoomOutcome(frames, out);
    return out;
  }
  absl::StatusOr<wire::StatusMessage> parsed =
      options_.lenient_status ? wire::ParseStatusLenient(frames) : wire::ParseStatus(frames);
  if (!parsed.ok()) {
    out.rejected = AddContext(parsed.status(), "status message dropped");
    return out;
  }
  if (options_.revision == layout::Revision::kSnapshot &&
      parsed->form != wire::StatusForm::kSnapshot) {
    // As the snapshot's reader, which takes exactly 5 frames (CACHEPD §3.4).
    out.rejected = MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat("status message dropped: ", frames.size(),
                     " frames, and this decode is pinned to CachePD snapshot, which reads exactly "
                     "5 (--cachepd-revision snapshot; CACHEPD §3.4, §12.9)"));
    return out;
  }
  auto found = rooms_.find(parsed->room);
  if (found == rooms_.end()) {
    out.rejected = absl::NotFoundError(
        absl::StrCat("status for untracked room ", parsed->room, " ignored (CACHEPD §3.4)"));
    return out;
  }
  Room& room = found->second;
  switch (parsed->status) {
    case TransferPollCode(TransferPoll::kSuccess):
      OnSuccess(parsed->room, room, *std::move(parsed), now, out);
      break;
    case TransferPollCode(TransferPoll::kFailed): {
      auto told = room.outcomes.find(static_cast<int>(parsed->prefill_rank));
      if (told != room.outcomes.end() && !told->second.cause.empty()) {
        FailRoom(parsed->room, room, FailureCauseFromLabel(told->second.cause),
                 absl::StrCat("prefill rank ", parsed->prefill_rank, ": ", told->second.reason),
                 now, out);
        break;
      }
      FailRoom(parsed->room, room, FailureCause::kPeerFailed,
               absl::StrCat("Failed to get kvcache from prefill instance, it might be dead "
                            "(prefill TP rank ",
                            parsed->prefill_rank, " reported Failed)"),
               now, out);
      break;
    }
    default: {
      // §3.4 item 4: merged by the update rule, unvalidated, as the reference does.
      std::optional<TransferPoll> poll = TransferPollFromCode(parsed->status);
      if (!poll.has_value()) {
        out.rejected = absl::InvalidArgumentError(
            absl::StrCat("status ", parsed->status, " for room ", parsed->room,
                         " is not a TransferPoll code; ignored"));
        break;
      }
      SetState(parsed->room, room, *poll, out);
      break;
    }
  }
  return out;
}

void DecodeRooms::OnFencedAnswer(absl::Span<const std::string> frames, absl::Time now,
                                 DecodeOutput& out) {
  absl::StatusOr<wire::FencedAnswer> answer = wire::ParseFencedAnswer(frames);
  if (!answer.ok()) {
    out.rejected = AddContext(answer.status(), "fence answer dropped");
    return;
  }
  auto found = fences_.find(answer->room);
  if (found == fences_.end()) {
    out.rejected = absl::NotFoundError(
        absl::StrCat("fence answer for room ", answer->room, " whose pages are not held: ignored"));
    return;
  }
  Fence& fence = found->second;
  std::vector<PrefillTarget>& pending = fence.pending;
  const int rank = static_cast<int>(answer->prefill_rank);
  auto at = std::find_if(pending.begin(), pending.end(),
                         [rank](const PrefillTarget& t) { return t.rank == rank; });
  if (at == pending.end()) return;  // a repeated answer
  if (!answer->proven) {
    // It disconnected a data plane that did not drain: what it had handed over may still come.
    // Its connections are refused first (OnWriterRefused), where the caller can.
    fence.refusing.push_back(*at);
    if (std::find(out.refuse_writers.begin(), out.refuse_writers.end(), at->endpoint) ==
        out.refuse_writers.end()) {
      out.refuse_writers.push_back(at->endpoint);
    }
  }
  pending.erase(at);
  if (!pending.empty() || !fence.refusing.empty()) return;
  if (ReleaseAnswered(answer->room, fence, "every prefill rank that may write the room fenced it",
                      now, out)) {
    fences_.erase(found);
  }
}

bool DecodeRooms::ReleaseAnswered(uint64_t room_id, Fence& fence, std::string proven_why,
                                  absl::Time now, DecodeOutput& out) {
  if (!fence.unproven.empty()) {
    return Release(fence,
                   PagesRelease{room_id, false,
                                absl::StrCat(absl::StrJoin(fence.unproven, ", "),
                                             " fenced the room by disconnecting a data plane that "
                                             "did not drain: writes it had already handed over "
                                             "may still land, so the pages are not provably safe"),
                                now - fence.started},
                   out);
  }
  if (!fence.refused.empty()) {
    absl::StrAppend(&proven_why, " (", absl::StrJoin(fence.refused, ", "),
                    " by disconnecting a data plane that did not drain, whose connections this "
                    "sidecar then refused: nothing it had handed over lands)");
  }
  return Release(fence, PagesRelease{room_id, true, std::move(proven_why), now - fence.started},
                 out);
}

DecodeOutput DecodeRooms::OnWriterRefused(absl::string_view endpoint, bool refused,
                                          absl::Time now) {
  DecodeOutput out;
  std::vector<uint64_t> answered;
  for (auto& [id, fence] : fences_) {
    bool found = false;
    for (auto it = fence.refusing.begin(); it != fence.refusing.end();) {
      if (it->endpoint != endpoint) {
        ++it;
        continue;
      }
      (refused ? fence.refused : fence.unproven).push_back(Describe(*it));
      it = fence.refusing.erase(it);
      found = true;
    }
    if (found && fence.pending.empty() && fence.refusing.empty() && !fence.release) {
      answered.push_back(id);
    }
  }
  std::sort(answered.begin(), answered.end());
  for (uint64_t id : answered) {
    if (ReleaseAnswered(id, fences_[id], "every prefill rank that may write the room fenced it",
                        now, out)) {
      fences_.erase(id);
    }
  }
  return out;
}

void DecodeRooms::OnRoomOutcome(absl::Span<const std::string> frames, DecodeOutput& out) {
  absl::StatusOr<wire::RoomOutcomeMessage> outcome = wire::ParseRoomOutcome(frames);
  if (!outcome.ok()) {
    out.rejected = AddContext(outcome.status(), "room outcome dropped");
    return;
  }
  auto found = rooms_.find(outcome->room);
  const int rank = static_cast<int>(outcome->prefill_rank);
  if (found == rooms_.end() || !found->second.routed ||
      std::none_of(found->second.targets.begin(), found->second.targets.end(),
                   [rank](const PrefillTarget& t) { return t.rank == rank; })) {
    out.rejected = absl::NotFoundError(absl::StrCat("room outcome of room ", outcome->room,
                                                    " from prefill rank ", rank,
                                                    ", not a target of a live room: ignored"));
    return;
  }
  found->second.outcomes[rank] = Room::Outcome{
      outcome->bytes, outcome->copies, std::move(outcome->cause), std::move(outcome->reason)};
}

void DecodeRooms::OnSuccess(uint64_t room_id, Room& room, wire::StatusMessage message,
                            absl::Time now, DecodeOutput& out) {
  const uint32_t rank = message.prefill_rank;
  if (!room.routed) {
    FailRoom(room_id, room, FailureCause::kInvalid,
             absl::StrCat("Received KV completion before its transfer route was registered "
                          "(from prefill TP rank ",
                          rank, ")"),
             now, out);
    return;
  }
  const int sender = static_cast<int>(rank);
  if (rank > static_cast<uint32_t>(plan::kMaxTpSize) ||
      !std::binary_search(room.expected.begin(), room.expected.end(), sender)) {
    FailRoom(room_id, room, FailureCause::kInvalid,
             absl::StrCat("Received KV completion from an unexpected Prefill TP rank ", rank,
                          " (expected ", RankList(room.expected), ")"),
             now, out);
    return;
  }
  auto at = std::lower_bound(room.responders.begin(), room.responders.end(), sender);
  if (at == room.responders.end() || *at != sender) room.responders.insert(at, sender);
  if (message.bootstrap_token != wire::kNoBootstrapToken && !room.pending_token.has_value()) {
    room.pending_token = message.bootstrap_token;
  }
  if (message.spec_candidate_ids.has_value() && !room.pending_spec_ids.has_value()) {
    room.pending_spec_ids = std::move(message.spec_candidate_ids);
  }
  // CACHEPD §12.9: TP ranks report overlapping prefixes, so every Success of an expected rank,
  // repeated ones included, raises the count to its maximum; the first logprob is kept.
  room.cached_tokens = std::max(room.cached_tokens, message.cached_tokens);
  if (message.bootstrap_logprob.has_value() && !room.pending_logprob.has_value()) {
    room.pending_logprob = message.bootstrap_logprob;
  }
  if (room.responders.size() < room.expected.size()) return;
  if (room.responders != room.expected) {
    // Unreachable while only ranks of E_d are counted; kept as the reference's own check.
    FailRoom(room_id, room, FailureCause::kInvalid,
             absl::StrCat("KV completion set ", RankList(room.responders),
                          " differs from the expected Prefill TP ranks ", RankList(room.expected)),
             now, out);
    return;
  }
  if (!room.published) {
    room.published = true;
    room.success_at = now;
    room.token = room.pending_token;
    room.spec_ids = room.pending_spec_ids;
    room.logprob = room.pending_logprob;
    room.published_cached_tokens = room.cached_tokens;
  }
  SetState(room_id, room, TransferPoll::kSuccess, out);
}

DecodeOutput DecodeRooms::Fail(uint64_t room_id, absl::string_view reason, absl::Time now,
                               FailureCause cause) {
  DecodeOutput out;
  auto found = rooms_.find(room_id);
  if (found != rooms_.end()) FailRoom(room_id, found->second, cause, Owned(reason), now, out);
  return out;
}

DecodeOutput DecodeRooms::FailAll(absl::string_view reason, absl::Time now) {
  DecodeOutput out;
  std::vector<uint64_t> live;
  for (const auto& [id, room] : rooms_) {
    if (room.state != TransferPoll::kFailed && room.state != TransferPoll::kSuccess) {
      live.push_back(id);
    }
  }
  std::sort(live.begin(), live.end());
  for (uint64_t id : live) FailRoom(id, rooms_[id], FailureCause::kEngine, Owned(reason), now, out);
  return out;
}

DecodeOutput DecodeRooms::Tick(absl::Time now) {
  DecodeOutput out;
  std::vector<uint64_t> expired;
  for (const auto& [id, room] : rooms_) {
    if (room.preallocated && room.state != TransferPoll::kSuccess &&
        room.state != TransferPoll::kFailed &&
        now - room.waiting_since >= options_.timeouts.waiting_timeout) {
      expired.push_back(id);
    }
  }
  std::vector<uint64_t> unanswered;
  for (const auto& [id, fence] : fences_) {
    // A release decided already waits only for a copy into the pages: not for a fence answer.
    if (!fence.release && now - fence.started >= options_.fence_wait) unanswered.push_back(id);
  }
  std::sort(unanswered.begin(), unanswered.end());
  for (uint64_t id : unanswered) {
    Fence& fence = fences_[id];
    std::vector<std::string> names;
    for (const PrefillTarget& t : fence.pending) {
      names.push_back(Describe(t));
    }
    for (const PrefillTarget& t : fence.refusing) {  // answered unproven; not refused in time
      names.push_back(Describe(t));
    }
    if (Release(fence,
                PagesRelease{
                    id, false,
                    absl::StrCat(absl::StrJoin(names, ", "),
                                 " did not answer the fence request within ",
                                 absl::FormatDuration(options_.fence_wait),
                                 " (not a kvrail peer, or gone or unreachable): the pages are not "
                                 "provably safe from its late writes"),
                    now - fence.started},
                out)) {
      fences_.erase(id);
    }
  }
  std::sort(expired.begin(), expired.end());
  for (uint64_t id : expired) {
    Room& room = rooms_[id];
    FailRoom(
        id, room, FailureCause::kTimeout,
        absl::StrCat("waiting timeout: Success from ", RankList(room.responders), " of ",
                     RankList(room.expected), " after ",
                     absl::FormatDuration(now - room.waiting_since), " (limit ",
                     absl::FormatDuration(options_.timeouts.waiting_timeout), ", CACHEPD §7.4)"),
        now, out);
  }
  return out;
}

DecodeOutput DecodeRooms::OnHealth(absl::string_view bootstrap_address, bool ok, absl::Time now) {
  DecodeOutput out;
  const std::string address = Owned(bootstrap_address);
  if (ok) {
    health_failures_.erase(address);
    return out;
  }
  const int failures = ++health_failures_[address];
  const int limit = EffectiveHeartbeatMaxFailures(options_.timeouts);
  if (failures < limit) return out;
  health_failures_.erase(address);
  ForgetPeerSets(address);
  std::vector<uint64_t> affected;
  for (const auto& [id, room] : rooms_) {
    if (room.bootstrap_address == address && room.state != TransferPoll::kSuccess &&
        room.state != TransferPoll::kFailed) {
      affected.push_back(id);
    }
  }
  std::sort(affected.begin(), affected.end());
  for (uint64_t id : affected) {
    FailRoom(id, rooms_[id], FailureCause::kPeerFailed,
             absl::StrCat("prefill node ", address, " declared dead after ", failures,
                          " consecutive failed /health probes (CACHEPD §1.6)"),
             now, out);
  }
  out.dead_prefills.push_back(address);
  return out;
}

DecodeOutput DecodeRooms::OnPrefillGone(absl::string_view endpoint, absl::Time now) {
  DecodeOutput out;
  if (gone_prefills_.size() >= kMaxGonePrefills && !gone_prefills_.contains(endpoint)) {
    auto oldest =
        std::min_element(gone_prefills_.begin(), gone_prefills_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    gone_prefills_.erase(oldest);
  }
  gone_prefills_.try_emplace(Owned(endpoint), now);
  // A process listening there later (restarted on the same port) never saw this decode's
  // registration: the peer sets that named the endpoint register again with their next room.
  for (auto it = registered_.begin(); it != registered_.end();) {
    const bool named =
        std::find(it->second.begin(), it->second.end(), endpoint) != it->second.end();
    it = named ? registered_.erase(it) : std::next(it);
  }
  std::vector<uint64_t> hit;
  for (const auto& [id, room] : rooms_) {
    if (!room.preallocated || room.state == TransferPoll::kSuccess ||
        room.state == TransferPoll::kFailed) {
      continue;
    }
    for (const PrefillTarget& t : room.targets) {
      if (t.endpoint == endpoint &&
          std::binary_search(room.expected.begin(), room.expected.end(), t.rank) &&
          !std::binary_search(room.responders.begin(), room.responders.end(), t.rank)) {
        hit.push_back(id);
        break;
      }
    }
  }
  std::sort(hit.begin(), hit.end());
  for (uint64_t id : hit) {
    FailRoom(id, rooms_[id], FailureCause::kPeerFailed,
             absl::StrCat("prefill rank at ", endpoint,
                          " is gone (its CachePD socket refuses connections): its process died"),
             now, out);
  }
  std::vector<uint64_t> released;
  for (auto& [id, fence] : fences_) {
    const auto at_endpoint = [&](const PrefillTarget& t) { return t.endpoint == endpoint; };
    const size_t before = fence.pending.size() + fence.refusing.size();
    fence.pending.erase(std::remove_if(fence.pending.begin(), fence.pending.end(), at_endpoint),
                        fence.pending.end());
    // One that answered unproven and is gone now: a process that is gone writes nothing more,
    // and what it had handed over the caller refused before this verdict.
    fence.refusing.erase(std::remove_if(fence.refusing.begin(), fence.refusing.end(), at_endpoint),
                         fence.refusing.end());
    if (fence.pending.size() + fence.refusing.size() < before && fence.pending.empty() &&
        fence.refusing.empty() && !fence.release) {
      released.push_back(id);
    }
  }
  std::sort(released.begin(), released.end());
  for (uint64_t id : released) {
    if (ReleaseAnswered(id, fences_[id],
                        absl::StrCat("every prefill rank that may write the room fenced it, "
                                     "or is gone (",
                                     endpoint, " refuses connections)"),
                        now, out)) {
      fences_.erase(id);
    }
  }
  // The fence requests just queued for the gone rank will not be answered: drop them.
  out.messages.erase(std::remove_if(out.messages.begin(), out.messages.end(),
                                    [&](const OutboundMessage& m) {
                                      return m.endpoint == endpoint &&
                                             wire::IsFenceRequest(m.frames);
                                    }),
                     out.messages.end());
  return out;
}

void DecodeRooms::OnPrefillListening(absl::string_view endpoint) { gone_prefills_.erase(endpoint); }

std::vector<std::string> DecodeRooms::GonePrefills() const {
  std::vector<std::string> endpoints;
  endpoints.reserve(gone_prefills_.size());
  for (const auto& [endpoint, since] : gone_prefills_) endpoints.push_back(endpoint);
  std::sort(endpoints.begin(), endpoints.end());
  return endpoints;
}

std::vector<std::string> DecodeRooms::PrefillEndpoints() const {
  std::set<std::string> endpoints;
  for (const auto& [id, room] : rooms_) {
    if (!room.preallocated || room.state == TransferPoll::kSuccess ||
        room.state == TransferPoll::kFailed) {
      continue;
    }
    for (const PrefillTarget& t : room.targets) endpoints.insert(t.endpoint);
  }
  for (const auto& [id, fence] : fences_) {
    for (const PrefillTarget& t : fence.pending) endpoints.insert(t.endpoint);
  }
  return std::vector<std::string>(endpoints.begin(), endpoints.end());
}

void DecodeRooms::Free(uint64_t room) { rooms_.erase(room); }

absl::Status DecodeRooms::KeepManifest(uint64_t room_id,
                                       std::shared_ptr<const layout::Manifest> manifest) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " is not tracked"));
  }
  found->second.manifest = std::move(manifest);
  return absl::OkStatus();
}

std::shared_ptr<const layout::Manifest> DecodeRooms::ManifestOf(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  return found == rooms_.end() ? nullptr : found->second.manifest;
}

std::optional<int> DecodeRooms::RankAt(uint64_t room_id, const std::string& endpoint) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return std::nullopt;
  for (const PrefillTarget& target : found->second.targets) {
    if (target.endpoint == endpoint) return target.rank;
  }
  return std::nullopt;
}

absl::Status DecodeRooms::KeepDigest(uint64_t room_id, int prefill_rank, uint64_t digest) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " is not tracked"));
  }
  Room& room = found->second;
  const bool targeted = std::any_of(room.targets.begin(), room.targets.end(),
                                    [&](const PrefillTarget& t) { return t.rank == prefill_rank; });
  if (!targeted) {
    return absl::InvalidArgumentError(
        room.routed ? absl::StrCat("prefill rank ", prefill_rank, " is not a rank of room ",
                                   room_id, "'s route")
                    : absl::StrCat("room ", room_id, " has no route yet"));
  }
  room.digests[prefill_rank] = digest;
  return absl::OkStatus();
}

std::optional<uint64_t> DecodeRooms::TakeDigest(uint64_t room_id, int prefill_rank) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return std::nullopt;
  auto taken = found->second.digests.extract(prefill_rank);
  return taken.empty() ? std::nullopt : std::optional<uint64_t>(taken.mapped());
}

void DecodeRooms::ForgetPeerSets(absl::string_view bootstrap_address) {
  const std::string address = Owned(bootstrap_address);
  auto first = registered_.lower_bound(PeerSetKey{address, std::numeric_limits<int>::min(), ""});
  auto last = first;
  while (last != registered_.end() && std::get<0>(last->first) == address) ++last;
  registered_.erase(first, last);
}

void DecodeRooms::SetState(uint64_t room_id, Room& room, TransferPoll state, DecodeOutput& out) {
  // Every change goes through the role's transition table (room_transitions.h).
  bool unlisted = false;
  const std::optional<TransferPoll> moved =
      NextRoomState(LedgerRole::kDecode, room.state, state, &unlisted);
  if (unlisted) ++unlisted_moves_;
  if (!moved) return;
  const TransferPoll next = *moved;
  room.state = next;
  if (next != TransferPoll::kFailed && next != TransferPoll::kSuccess) {
    ReportCurrent(room_id, room, out);
    return;
  }
  // Exactly one terminal event per room: remembered here (by count alone), a second is never
  // made.
  DecodeOutput ended;
  ReportCurrent(room_id, room, ended);
  if (!ended_.Remember(ended.events.back(), absl::InfiniteFuture(), absl::InfinitePast())) return;
  out.events.push_back(std::move(ended.events.back()));
}

void DecodeRooms::FailRoom(uint64_t room_id, Room& room, FailureCause cause, std::string reason,
                           absl::Time now, DecodeOutput& out) {
  if (room.state == TransferPoll::kFailed) return;
  room.failure_reason = std::move(reason);
  room.failure_cause = cause;
  // Failed means fenced: every rank of E_d that got a pre-allocation and has not sent Success
  // may still be writing the pages (Z_d ranks never write).
  Fence fence;
  fence.started = now;
  if (room.preallocated) {
    for (const PrefillTarget& target : room.targets) {
      if (std::binary_search(room.expected.begin(), room.expected.end(), target.rank) &&
          !std::binary_search(room.responders.begin(), room.responders.end(), target.rank)) {
        fence.pending.push_back(target);
      }
    }
  }
  for (const PrefillTarget& target : fence.pending) {
    absl::StatusOr<std::vector<std::string>> frames =
        wire::BuildFenceRequest({room_id, identity_.session_id});
    if (frames.ok()) out.messages.push_back(OutboundMessage{target.endpoint, *std::move(frames)});
  }
  // A copy back into the pages still runs (a staged arena): they are held until it returned,
  // even when no prefill rank may write them any more.
  fence.staging = room.staging;
  if (fence.pending.empty() && fence.staging > 0) {
    fence.release = PagesRelease{room_id, true,
                                 "no prefill rank may write the room's pages, and the copies of "
                                 "what landed back into them returned",
                                 absl::ZeroDuration()};
  }
  if (!fence.pending.empty() || fence.staging > 0) fences_[room_id] = std::move(fence);
  SetState(room_id, room, TransferPoll::kFailed, out);
}

bool DecodeRooms::Release(Fence& fence, PagesRelease release, DecodeOutput& out) {
  if (fence.staging > 0) {
    fence.release = std::move(release);
    return false;
  }
  out.releases.push_back(std::move(release));
  return true;
}

void DecodeRooms::BeginStaging(uint64_t room_id) {
  auto room = rooms_.find(room_id);
  if (room == rooms_.end() || room->second.state == TransferPoll::kFailed ||
      room->second.state == TransferPoll::kSuccess) {
    return;
  }
  ++room->second.staging;
}

DecodeOutput DecodeRooms::EndStaging(uint64_t room_id, absl::Time now) {
  DecodeOutput out;
  // A failed room's count moved to its fence (FailRoom); a live room keeps its own.
  auto fence = fences_.find(room_id);
  if (fence != fences_.end() && fence->second.staging > 0) {
    if (--fence->second.staging > 0 || !fence->second.release) return out;
    PagesRelease release = *std::move(fence->second.release);
    release.waited = now - fence->second.started;
    out.releases.push_back(std::move(release));
    fences_.erase(fence);
    return out;
  }
  auto room = rooms_.find(room_id);
  if (room != rooms_.end() && room->second.staging > 0) --room->second.staging;
  return out;
}

void DecodeRooms::ReportCurrent(uint64_t room_id, const Room& room, DecodeOutput& out) const {
  RoomEvent event;
  event.room = room_id;
  event.state = room.state;
  if (room.state == TransferPoll::kFailed) {
    event.reason = room.failure_reason;
    event.cause = room.failure_cause;
    event.pages = fences_.count(room_id) > 0 ? Pages::kHeld : Pages::kReusable;
  }
  if (room.state == TransferPoll::kSuccess) {
    for (int rank : room.expected) {
      auto told = room.outcomes.find(rank);
      if (told == room.outcomes.end()) continue;
      event.bytes += told->second.bytes;
      event.copies += told->second.copies;
    }
    event.elapsed = room.success_at - room.waiting_since;
    event.bootstrap_token = room.token.value_or(wire::kNoBootstrapToken);
    event.spec_candidate_ids = room.spec_ids;
    event.cached_tokens = room.published_cached_tokens;
    event.bootstrap_logprob = room.logprob;
  }
  out.events.push_back(std::move(event));
}

std::optional<TransferPoll> DecodeRooms::State(uint64_t room) const {
  auto found = rooms_.find(room);
  if (found == rooms_.end()) return std::nullopt;
  return found->second.state;
}

std::optional<TransferPoll> DecodeRooms::EngineState(uint64_t room) const {
  auto found = rooms_.find(room);
  if (found == rooms_.end()) return std::nullopt;
  const Room& r = found->second;
  if (r.preallocated && r.state != TransferPoll::kSuccess && r.state != TransferPoll::kFailed) {
    return TransferPoll::kTransferring;
  }
  return r.state;
}

std::optional<DecodeRoomView> DecodeRooms::Find(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return std::nullopt;
  const Room& room = found->second;
  DecodeRoomView view;
  view.state = room.state;
  view.bootstrap_address = room.bootstrap_address;
  view.failure_reason = room.failure_reason;
  view.failure_cause = room.failure_cause;
  if (room.routed) view.expected_prefill_ranks = room.expected;
  view.responders = room.responders;
  if (room.published) {
    view.bootstrap_token = room.token;
    view.spec_candidate_ids = room.spec_ids;
    view.bootstrap_logprob = room.logprob;
  }
  view.cached_tokens = room.cached_tokens;
  return view;
}

std::vector<std::string> DecodeRooms::BootstrapAddresses() const {
  std::set<std::string> addresses;
  for (const auto& [id, room] : rooms_) addresses.insert(room.bootstrap_address);
  for (const auto& [key, endpoints] : registered_) addresses.insert(std::get<0>(key));
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

bool DecodeRooms::IsRegistered(absl::string_view bootstrap_address, int dp_group,
                               absl::Span<const int> target_ranks) const {
  return registered_.count(
             PeerSetKey{Owned(bootstrap_address), dp_group, absl::StrJoin(target_ranks, ",")}) > 0;
}

}  // namespace kvrail::session
