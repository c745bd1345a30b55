#include "control/session/prefill_rooms.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/layout/peer_messages.h"
#include "control/layout/revision.h"
#include "control/plan/layerwise.h"
#include "control/plan/route.h"
#include "control/session/ended_room.h"
#include "control/wire/dispatch.h"
#include "control/wire/fence.h"
#include "control/wire/limits.h"
#include "control/wire/outcome.h"
#include "control/wire/preallocation.h"
#include "control/wire/status.h"
#include "engine/base/error.h"

namespace kvrail::session {
namespace {

// The status form a peer is answered in: the form its registration contract came in (CACHEPD
// §12.9, §12.11). wire::StatusForm mirrors layout::Revision, which control/wire cannot use.
wire::StatusForm StatusFormFor(layout::Revision revision) {
  return revision == layout::Revision::kSnapshot ? wire::StatusForm::kSnapshot
                                                 : wire::StatusForm::k2026_09;
}

// The status form a rejected registration is answered in: its contract's, when the contract
// parses; otherwise nothing the peer sent decides, and it is the newest (kNewestRevision). A
// snapshot reference decode ignores frames after 4 (CACHEPD §3.4), so it still reads that.
wire::StatusForm StatusFormOfRegistration(absl::Span<const std::string> frames) {
  absl::StatusOr<layout::DecodedRegistration> decoded = layout::DecodeRegistration(frames);
  return StatusFormFor(decoded.ok() ? decoded->contract.revision : layout::kNewestRevision);
}

// Planners are cached per (decode TP size, decode contract): every decode rank of one decode
// deployment shares one. A bound keeps a stream of distinct contracts from growing it forever.
constexpr size_t kMaxCachedPlanners = 64;

// An owned copy (spelled as a two-argument constructor: a one-argument one reads as a cast).
std::string Owned(absl::string_view text) { return std::string(text.data(), text.size()); }

// Whether two pre-allocations name the same blocks (null: a dummy's empty manifest).
bool SameBlocks(const layout::Manifest* a, const layout::Manifest* b) {
  if (a == nullptr || b == nullptr) return a == b;
  if (a->prefix_len != b->prefix_len || a->prompt_len != b->prompt_len ||
      a->groups.size() != b->groups.size()) {
    return false;
  }
  for (size_t i = 0; i < a->groups.size(); ++i) {
    if (a->groups[i].group_id != b->groups[i].group_id ||
        a->groups[i].block_ids != b->groups[i].block_ids) {
      return false;
    }
  }
  return true;
}

bool SameRegistration(const DecodePeer& a, const DecodePeer& b) {
  const wire::Registration& x = a.registration;
  const wire::Registration& y = b.registration;
  return x.endpoint == y.endpoint && x.port == y.port && x.session_id == y.session_id &&
         x.arena_base == y.arena_base && x.decode_tp_size == y.decode_tp_size &&
         x.decode_tp_rank == y.decode_tp_rank && a.canonical_contract == b.canonical_contract;
}

// Same contract and TP coordinates: only the reply route or the arena base moved (§11.1).
bool SameDecodeRank(const DecodePeer& a, const DecodePeer& b) {
  return a.registration.decode_tp_size == b.registration.decode_tp_size &&
         a.registration.decode_tp_rank == b.registration.decode_tp_rank &&
         a.canonical_contract == b.canonical_contract;
}

std::string RankList(absl::Span<const int> ranks) {
  return absl::StrCat("{", absl::StrJoin(ranks, ","), "}");
}

// The bytes `plan` copies for a room whose source manifest is `src`: every row of every bound
// fragment for each block position the plan sends.
uint64_t PlannedBytes(const plan::CopyPlan& plan, const layout::Manifest& src,
                      plan::CopyPlan::LayerRange layers = {}) {
  uint64_t total = 0;
  const bool every_layer = layers.begin <= 0 && layers.end == INT64_MAX;
  for (size_t index = 0; index < plan.fragments().size(); ++index) {
    const plan::BoundFragment& f = plan.fragments()[index];
    const int64_t layer = plan.fragment_layer(index);
    if (!every_layer && (layer < layers.begin || layer >= layers.end)) continue;
    if (f.group_index < 0 || static_cast<size_t>(f.group_index) >= src.groups.size()) continue;
    const size_t blocks = src.groups[f.group_index].block_ids.size();
    uint64_t positions = 0;
    for (size_t i = 0; i < blocks; ++i) positions += plan.SendsPosition(f, src, i) ? 1 : 0;
    total += positions * static_cast<uint64_t>(f.rows) * static_cast<uint64_t>(f.bytes_per_row);
  }
  return total;
}

bool SameManifest(const layout::Manifest& a, const layout::Manifest& b) {
  if (a.prefix_len != b.prefix_len || a.prompt_len != b.prompt_len ||
      a.groups.size() != b.groups.size()) {
    return false;
  }
  for (size_t g = 0; g < a.groups.size(); ++g) {
    if (a.groups[g].group_id != b.groups[g].group_id ||
        a.groups[g].block_ids != b.groups[g].block_ids) {
      return false;
    }
  }
  return true;
}

// A destination's manifest must describe the same prompt window and the same block count per
// group as the source (CACHEPD §6.9, §8 "All Decode destinations of a room must agree").
absl::Status CheckPairs(const layout::Manifest& src, const layout::Manifest& dst,
                        absl::string_view session_id) {
  if (src.prefix_len != dst.prefix_len || src.prompt_len != dst.prompt_len) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination ", session_id, " pre-allocated the prompt window [",
                     dst.prefix_len, ", ", dst.prompt_len, ") but the source manifest covers [",
                     src.prefix_len, ", ", src.prompt_len, ")"));
  }
  if (src.groups.size() != dst.groups.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination ", session_id, " has ", dst.groups.size(),
                     " manifest groups, the source ", src.groups.size()));
  }
  for (size_t g = 0; g < src.groups.size(); ++g) {
    if (src.groups[g].group_id != dst.groups[g].group_id ||
        src.groups[g].block_ids.size() != dst.groups[g].block_ids.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("destination ", session_id, " group '", dst.groups[g].group_id, "' has ",
                       dst.groups[g].block_ids.size(), " blocks, the source group '",
                       src.groups[g].group_id, "' ", src.groups[g].block_ids.size()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PrefillRooms> PrefillRooms::Create(PrefillIdentity identity,
                                                  PrefillOptions options) {
  if (identity.prefill_tp_size < 1 || identity.prefill_tp_size > plan::kMaxTpSize) {
    return absl::InvalidArgumentError(absl::StrCat("prefill TP size ", identity.prefill_tp_size,
                                                   " is outside 1..", plan::kMaxTpSize));
  }
  if (identity.prefill_tp_rank < 0 || identity.prefill_tp_rank >= identity.prefill_tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("prefill TP rank ", identity.prefill_tp_rank,
                                                   " is outside 0..",
                                                   identity.prefill_tp_size - 1));
  }
  // The rank every status and fence answer carries (CACHEPD §3.4; §10.1 for a pipeline's
  // global ranks): one a decode could not parse would make every room of this rank time out.
  if (identity.status_rank > static_cast<int>(wire::kMaxPrefillRank)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill status rank ", identity.status_rank,
                                                   " is outside 0..", wire::kMaxPrefillRank,
                                                   " (CACHEPD §3.4: a status's frame 2)"));
  }
  return PrefillRooms(std::move(identity), options);
}

PrefillRooms::PrefillRooms(PrefillIdentity identity, PrefillOptions options)
    : identity_(std::move(identity)), options_(options), ended_(options.remembered_rooms) {}

// --- peer messages ----------------------------------------------------------------------

PrefillOutput PrefillRooms::OnMessage(absl::Span<const std::string> frames, absl::Time now) {
  PrefillOutput out;
  if (wire::IsFenceRequest(frames)) {
    OnFenceRequest(frames, now, out);
    return out;
  }
  switch (wire::Classify(frames)) {
    case wire::MessageKind::kRegistration:
      OnRegistration(frames, now, out);
      break;
    case wire::MessageKind::kPreallocation:
      OnPreallocation(frames, now, out);
      break;
    case wire::MessageKind::kDropped:
      out.rejected = MakeError(ErrorCategory::kInvalidFrame,
                               "message dropped: frame 0 is missing or not ASCII (CACHEPD §3.2.1)");
      break;
  }
  return out;
}

void PrefillRooms::OnFenceRequest(absl::Span<const std::string> frames, absl::Time now,
                                  PrefillOutput& out) {
  absl::StatusOr<wire::FenceRequest> request = wire::ParseFenceRequest(frames);
  if (!request.ok()) {
    out.rejected = AddContext(request.status(), "fence request dropped");
    return;
  }
  if (registrations_.find(request->session_id) == registrations_.end()) {
    out.rejected = MakeError(
        ErrorCategory::kInvalidFrame,
        absl::StrCat("fence request for room ", request->room, " from unregistered Decode session ",
                     request->session_id, " dropped: nobody to answer"));
    return;
  }
  if (const EndedRoom* ended = ended_.Find(request->room)) {
    // Landed, or already fenced (and as well as its fence could prove).
    AnswerFence(request->room, request->session_id,
                ended->unproven_sessions.count(request->session_id) == 0, out);
    return;
  }
  auto found = rooms_.find(request->room);
  if (found == rooms_.end()) {
    // Never held here: no write of it left this rank. (Its pre-allocation, if any, came on the
    // same ordered route before this request, so none can follow.)
    AnswerFence(request->room, request->session_id, true, out);
    return;
  }
  Room& room = found->second;
  if (room.state == TransferPoll::kSuccess || room.state == TransferPoll::kFailed) {
    // Landed, or already fenced (and as well as its fence could prove).
    AnswerFence(request->room, request->session_id,
                room.unproven_sessions.count(request->session_id) == 0, out);
    return;
  }
  AbortRoom(request->room, room, FailureCause::kAborted,
            absl::StrCat("aborted by the decode: Decode session ", request->session_id,
                         " gave the room up (kvrail fence request)"),
            now, out);
  if (room.transfers.has_value()) {  // fencing: answered once no write of it can land
    if (std::find(room.fence_waiters.begin(), room.fence_waiters.end(), request->session_id) ==
        room.fence_waiters.end()) {
      room.fence_waiters.push_back(request->session_id);
    }
    return;
  }
  AnswerFence(request->room, request->session_id, true, out);
}

void PrefillRooms::AnswerFence(uint64_t room, absl::string_view session_id, bool proven,
                               PrefillOutput& out) const {
  auto registered = registrations_.find(session_id);
  if (registered == registrations_.end()) return;  // gone meanwhile: nobody to answer
  absl::StatusOr<std::vector<std::string>> frames = wire::BuildFencedAnswer(
      {room,
       static_cast<uint32_t>(identity_.status_rank >= 0 ? identity_.status_rank
                                                        : identity_.prefill_tp_rank),
       proven});
  if (!frames.ok()) return;  // rooms and ranks here always fit
  out.messages.push_back(OutboundMessage{registered->second->reply_endpoint, *std::move(frames)});
}

void PrefillRooms::OnRegistration(absl::Span<const std::string> frames, absl::Time now,
                                  PrefillOutput& out) {
  absl::StatusOr<wire::ReplyRoute> route = wire::ParseRegistrationReplyRoute(frames);
  if (!route.ok()) {
    // Nobody to answer and no session to blame (§3.2.3): refused and logged only.
    out.rejected = AddContext(route.status(), "registration dropped");
    return;
  }
  absl::StatusOr<std::shared_ptr<const DecodePeer>> admitted = Admit(*route, frames);
  if (!admitted.ok()) {
    RejectRegistration(
        *route,
        options_.revision ? StatusFormFor(*options_.revision) : StatusFormOfRegistration(frames),
        admitted.status(), now, out);
    return;
  }
  std::shared_ptr<const DecodePeer> peer = *std::move(admitted);
  auto stored = registrations_.find(route->session_id);
  if (stored == registrations_.end()) {
    if (options_.max_registrations > 0 && registrations_.size() >= options_.max_registrations) {
      RejectRegistration(*route, StatusFormFor(peer->contract.revision),
                         absl::ResourceExhaustedError(absl::StrCat(
                             "registration of a new Decode session refused: this prefill rank ",
                             "holds ", registrations_.size(), " registrations already ",
                             "(PrefillOptions::max_registrations, --max-registrations)")),
                         now, out);
      return;
    }
    AcceptRegistration(std::move(peer));
    return;
  }
  if (SameRegistration(*stored->second, *peer)) {
    AcceptRegistration(stored->second);  // a no-op but for clearing a quarantine
    return;
  }
  if (options_.accept_restarted_peer && SameDecodeRank(*stored->second, *peer)) {
    // §11.1: the decode restarted with the same session id; its old arena is gone.
    AbortRoomsOfSession(route->session_id, FailureCause::kPeerFailed,
                        absl::StrCat("Decode session ", route->session_id,
                                     " re-registered with a new reply route or arena base (a "
                                     "restarted decode): its pre-allocations are void"),
                        now, out);
    out.replaced.emplace_back(route->session_id, stored->second->reply_endpoint);
    AcceptRegistration(std::move(peer));
    return;
  }
  RejectRegistration(*route, StatusFormFor(peer->contract.revision),
                     MakeError(ErrorCategory::kInvalidFrame,
                               "conflicting registration for an active CachePD session "
                               "(CACHEPD §3.2.2)"),
                     now, out);
}

absl::StatusOr<std::shared_ptr<const DecodePeer>> PrefillRooms::Admit(
    const wire::ReplyRoute& route, absl::Span<const std::string> frames) {
  KVRAIL_ASSIGN_OR_RETURN(layout::DecodedRegistration decoded, layout::DecodeRegistration(frames));
  auto peer = std::make_shared<DecodePeer>();
  peer->registration = std::move(decoded.frames);
  peer->contract = std::move(decoded.contract);
  if (options_.revision.has_value() && peer->contract.revision != *options_.revision) {
    return MakeError(
        ErrorCategory::kIncompatiblePeer,
        absl::StrCat("registration contract is in the CachePD ",
                     layout::RevisionName(peer->contract.revision),
                     " form, and this prefill is pinned to ",
                     layout::RevisionName(*options_.revision),
                     ", whose reference refuses it (--cachepd-revision; CACHEPD §12.11)"));
  }
  KVRAIL_ASSIGN_OR_RETURN(peer->canonical_contract, layout::SerializeContract(peer->contract));
  peer->reply_endpoint = wire::ReplyEndpoint(route.endpoint, route.port);

  const int decode_tp_size = static_cast<int>(peer->registration.decode_tp_size);
  const int decode_tp_rank = static_cast<int>(peer->registration.decode_tp_rank);
  KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<const plan::Planner> planner,
                          PlannerFor(decode_tp_size, peer->canonical_contract, peer->contract));
  plan::RegistrationOutcome outcome =
      planner->OnRegistration(identity_.prefill_tp_rank, decode_tp_rank);
  switch (outcome.kind) {
    case plan::RegistrationOutcome::Kind::kReject:
      return AddContext(outcome.error,
                        absl::StrCat("decode TP rank ", decode_tp_rank, " of ", decode_tp_size,
                                     " on prefill TP rank ", identity_.prefill_tp_rank));
    case plan::RegistrationOutcome::Kind::kDummy:
      peer->dummy = true;
      break;
    case plan::RegistrationOutcome::Kind::kSend: {
      KVRAIL_ASSIGN_OR_RETURN(plan::CopyPlan copy_plan,
                              plan::CopyPlan::Bind(identity_.contract, peer->contract,
                                                   outcome.fragments, outcome.owner_filters));
      peer->copy_plan = std::make_shared<const plan::CopyPlan>(std::move(copy_plan));
      KVRAIL_ASSIGN_OR_RETURN(plan::DecodeTargets targets, planner->TargetsFor(decode_tp_rank));
      const std::vector<int>& sources = targets.expected_prefill_ranks;
      peer->route_sources = static_cast<int>(sources.size());
      peer->source_index = static_cast<int>(
          std::find(sources.begin(), sources.end(), identity_.prefill_tp_rank) - sources.begin());
      break;
    }
  }
  peer->fragments = std::move(outcome.fragments);
  peer->owner_filters = std::move(outcome.owner_filters);
  peer->expected_decode_ranks = std::move(outcome.expected_decode_ranks);
  return std::shared_ptr<const DecodePeer>(std::move(peer));
}

absl::StatusOr<std::shared_ptr<const plan::Planner>> PrefillRooms::PlannerFor(
    int decode_tp_size, const std::string& canonical_contract,
    const layout::Contract& decode_contract) {
  PlannerKey key{decode_tp_size, canonical_contract};
  auto cached = planners_.find(key);
  if (cached != planners_.end()) return cached->second;
  KVRAIL_ASSIGN_OR_RETURN(
      plan::Planner planner,
      plan::Planner::Create(identity_.prefill_tp_size, decode_tp_size, identity_.contract,
                            decode_contract, identity_.stage ? &*identity_.stage : nullptr));
  if (planners_.size() >= kMaxCachedPlanners) planners_.clear();
  auto shared = std::make_shared<const plan::Planner>(std::move(planner));
  planners_.emplace(std::move(key), shared);
  return shared;
}

void PrefillRooms::AcceptRegistration(std::shared_ptr<const DecodePeer> peer) {
  const std::string& session_id = peer->registration.session_id;
  if (rejected_.erase(session_id) > 0) {
    rejected_order_.erase(std::find(rejected_order_.begin(), rejected_order_.end(), session_id));
  }
  quarantine_.erase(session_id);
  registrations_[session_id] = std::move(peer);
}

void PrefillRooms::RejectRegistration(const wire::ReplyRoute& route, wire::StatusForm form,
                                      const absl::Status& error, absl::Time now,
                                      PrefillOutput& out) {
  AbortRoomsOfSession(route.session_id, FailureCause::kRefused,
                      absl::StrCat("Decode session ", route.session_id,
                                   " registration rejected: ", error.message()),
                      now, out);
  registrations_.erase(route.session_id);
  if (options_.max_remembered_rejections > 0) {
    if (rejected_.find(route.session_id) == rejected_.end()) {
      while (rejected_.size() >= options_.max_remembered_rejections) {
        rejected_.erase(rejected_order_.front());
        rejected_order_.pop_front();
      }
      rejected_order_.push_back(route.session_id);
    }
    rejected_[route.session_id] = Rejection{route, form};
  }
  out.rejected = AddContext(
      error, absl::StrCat("registration of Decode session ", route.session_id, " rejected"));
}

void PrefillRooms::AbortRoomsOfSession(absl::string_view session_id, FailureCause cause,
                                       absl::string_view reason, absl::Time now,
                                       PrefillOutput& out) {
  std::vector<uint64_t> affected;
  for (const auto& [id, room] : rooms_) {
    for (const Destination& d : room.destinations) {
      if (d.peer->registration.session_id == session_id) {
        affected.push_back(id);
        break;
      }
    }
  }
  std::sort(affected.begin(), affected.end());  // a deterministic order for the messages
  for (uint64_t id : affected) AbortRoom(id, rooms_[id], cause, Owned(reason), now, out);
}

void PrefillRooms::OnPreallocation(absl::Span<const std::string> frames, absl::Time now,
                                   PrefillOutput& out) {
  absl::StatusOr<wire::PreallocationRouteHeader> header =
      wire::ParsePreallocationRouteHeader(frames);
  if (!header.ok()) {
    // No room to fail and nobody to answer (§3.3): refused and logged only.
    out.rejected = AddContext(header.status(), "pre-allocation dropped");
    return;
  }
  const uint64_t room_id = header->room;
  const std::string& session_id = header->session_id;
  if (options_.unknown_sessions_change_nothing && !registrations_.contains(session_id)) {
    ReplyFailed(room_id, session_id, out);
    out.rejected = absl::FailedPreconditionError(
        absl::StrCat("pre-allocation of room ", room_id, " from ", session_id,
                     " ignored: CachePD request references an unregistered Decode session; no "
                     "room changes and nothing is stored"));
    return;
  }

  absl::StatusOr<layout::DecodedPreallocation> decoded = layout::DecodePreallocation(frames);
  if (!decoded.ok()) {
    RejectPreallocation(room_id, session_id, decoded.status(), now, out);
    return;
  }
  auto found = registrations_.find(session_id);
  if (found == registrations_.end()) {
    RejectPreallocation(
        room_id, session_id,
        absl::FailedPreconditionError(
            absl::StrCat("CachePD request references an unregistered Decode session ", session_id)),
        now, out);
    return;
  }
  std::shared_ptr<const DecodePeer> peer = found->second;
  if (decoded->manifest.has_value() == peer->dummy) {
    RejectPreallocation(room_id, session_id,
                        absl::FailedPreconditionError(absl::StrCat(
                            "CachePD request kind disagrees with its registration: ",
                            peer->dummy ? "a dummy registration got a manifest"
                                        : "a data registration got an empty manifest")),
                        now, out);
    return;
  }
  auto existing = rooms_.find(room_id);
  std::optional<TransferPoll> end;
  if (const EndedRoom* ended = ended_.Find(room_id)) {
    end = ended->state;
  } else if (existing != rooms_.end() && Ended(existing->second)) {
    end = existing->second.state;
  }
  if (end.has_value()) {
    // §3.3 step 5 (and kvrail: a completed room gets no more pre-allocations either).
    ReplyFailed(room_id, session_id, out);
    out.rejected = absl::FailedPreconditionError(
        absl::StrCat("pre-allocation of room ", room_id, " from ", session_id,
                     " answered with Failed: the room already ",
                     *end == TransferPoll::kFailed ? "failed" : "completed"));
    return;
  }
  if (decoded->manifest.has_value()) {
    absl::Status valid = layout::ValidateManifest(*decoded->manifest, peer->contract);
    if (!valid.ok()) {
      RejectPreallocation(room_id, session_id, valid, now, out);
      return;
    }
  }
  if (existing == rooms_.end() && options_.max_rooms > 0 && rooms_.size() >= options_.max_rooms) {
    // Bounded: a decode that pre-allocates rooms its prefill never begins cannot grow the table.
    ReplyFailed(room_id, session_id, out);
    out.rejected = absl::ResourceExhaustedError(absl::StrCat(
        "pre-allocation of room ", room_id, " from ", session_id, " refused: this prefill rank ",
        "tracks ", rooms_.size(), " rooms already (PrefillOptions::max_rooms, --max-rooms); ",
        "answered Failed, nothing of it is stored"));
    return;
  }
  Room empty;
  const Room& current = existing != rooms_.end() ? existing->second : empty;
  // The same session pre-allocating the same blocks again (a resend, or a replay) changes
  // nothing: ignored rather than the reference's "duplicate" error, which would abort a live
  // room (docs/SECURITY.md). Other blocks stay a duplicate (§3.3 step 7).
  for (const Destination& d : current.destinations) {
    if (!options_.ignore_repeated_preallocations) break;
    if (d.peer->registration.session_id == session_id &&
        SameBlocks(d.manifest.get(), decoded->manifest ? &*decoded->manifest : nullptr)) {
      out.rejected = absl::AlreadyExistsError(
          absl::StrCat("pre-allocation of room ", room_id, " from ", session_id,
                       " ignored: the session pre-allocated the same blocks already"));
      return;
    }
  }
  if (options_.max_rooms_per_session > 0 &&
      RoomsOfSession(session_id) >= options_.max_rooms_per_session) {
    // Bounded per session too: one decode filling max_rooms would lock every other one out.
    ReplyFailed(room_id, session_id, out);
    out.rejected = absl::ResourceExhaustedError(absl::StrCat(
        "pre-allocation of room ", room_id, " from ", session_id, " refused: the session holds ",
        "pre-allocations in ", RoomsOfSession(session_id), " rooms already ",
        "(PrefillOptions::max_rooms_per_session, --max-rooms-per-session); answered Failed, ",
        "nothing of it is stored"));
    return;
  }
  absl::Status collected = Collect(current, *peer);
  if (!collected.ok()) {
    RejectPreallocation(room_id, session_id, collected, now, out);
    return;
  }

  Room& room = rooms_[room_id];
  if (room.destinations.empty() && !room.begun && !room.state.has_value()) room.first_seen = now;
  Destination destination{peer, nullptr};
  if (decoded->manifest.has_value()) {
    destination.manifest = std::make_shared<const layout::Manifest>(*std::move(decoded->manifest));
  }
  AddDestination(room, std::move(destination));
  if (room.destinations.size() == peer->expected_decode_ranks.size()) {
    SetState(room_id, room, TransferPoll::kBootstrapped, now, out);
    if (!out.events.empty() && out.events.back().state == TransferPoll::kBootstrapped) {
      FillBootstrapped(room, out.events.back());
    }
    MaybeStartTransfer(room_id, room, now, out);
  }
}

void PrefillRooms::AddDestination(Room& room, Destination destination) {
  ++session_rooms_[destination.peer->registration.session_id];
  room.destinations.push_back(std::move(destination));
}

void PrefillRooms::DropDestinations(Room& room) {
  for (const Destination& d : room.destinations) {
    auto count = session_rooms_.find(d.peer->registration.session_id);
    if (count != session_rooms_.end() && --count->second == 0) session_rooms_.erase(count);
  }
  room.destinations.clear();
}

size_t PrefillRooms::RoomsOfSession(const std::string& session_id) const {
  auto count = session_rooms_.find(session_id);
  return count == session_rooms_.end() ? 0 : count->second;
}

// §3.3 step 7.
absl::Status PrefillRooms::Collect(const Room& room, const DecodePeer& peer) const {
  const size_t fanout = peer.expected_decode_ranks.size();
  for (const Destination& d : room.destinations) {
    if (d.peer->registration.session_id == peer.registration.session_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "duplicate CachePD pre-allocation for Decode session ", peer.registration.session_id));
    }
  }
  if (room.destinations.size() + 1 > fanout) {
    return absl::FailedPreconditionError(
        absl::StrCat("room already holds ", room.destinations.size(),
                     " pre-allocations and this prefill rank expects ", fanout));
  }
  if (room.destinations.size() + 1 < fanout) return absl::OkStatus();
  std::vector<int> ranks = {static_cast<int>(peer.registration.decode_tp_rank)};
  for (const Destination& d : room.destinations) {
    if (d.peer->registration.decode_tp_size != peer.registration.decode_tp_size ||
        d.peer->expected_decode_ranks != peer.expected_decode_ranks) {
      return absl::FailedPreconditionError(
          "Paged cache room destinations disagree on the decode TP size or the expected rank "
          "set");
    }
    ranks.push_back(static_cast<int>(d.peer->registration.decode_tp_rank));
  }
  std::sort(ranks.begin(), ranks.end());
  if (ranks != peer.expected_decode_ranks) {  // the expected set is sorted and distinct
    return absl::FailedPreconditionError(
        absl::StrCat("Paged cache room destination ranks disagree with the typed route plan: got ",
                     RankList(ranks), ", expected ", RankList(peer.expected_decode_ranks)));
  }
  return absl::OkStatus();
}

void PrefillRooms::RejectPreallocation(uint64_t room_id, absl::string_view session_id,
                                       const absl::Status& error, absl::Time now,
                                       PrefillOutput& out) {
  AbortRoom(room_id, rooms_[room_id], FailureCause::kInvalid,
            absl::StrCat("invalid pre-allocation metadata: ", error.message()), now, out);
  ReplyFailed(room_id, session_id, out);
  out.rejected = AddContext(
      error, absl::StrCat("pre-allocation of room ", room_id, " from ", session_id, " rejected"));
}

void PrefillRooms::ReplyFailed(uint64_t room, absl::string_view session_id,
                               PrefillOutput& out) const {
  auto registered = registrations_.find(session_id);
  if (registered != registrations_.end()) {
    auto failed = rooms_.find(room);
    if (failed != rooms_.end() && failed->second.state == TransferPoll::kFailed) {
      SendOutcome(room, registered->second->reply_endpoint, 0, 0, failed->second.failure_cause,
                  failed->second.failure_reason, out);
    } else {
      SendOutcome(room, registered->second->reply_endpoint, 0, 0, FailureCause::kRefused,
                  "its pre-allocation was refused (this prefill rank's log says why)", out);
    }
    SendStatus(room, registered->second->reply_endpoint,
               StatusFormFor(registered->second->contract.revision), TransferPoll::kFailed, nullptr,
               out);
    return;
  }
  auto rejected = rejected_.find(session_id);
  if (rejected != rejected_.end()) {
    const Rejection& rejection = rejected->second;
    SendStatus(room, wire::ReplyEndpoint(rejection.route.endpoint, rejection.route.port),
               rejection.form, TransferPoll::kFailed, nullptr, out);
  }
}

void PrefillRooms::SendOutcome(uint64_t room, const std::string& endpoint, uint64_t bytes,
                               uint64_t copies, FailureCause cause, const std::string& reason,
                               PrefillOutput& out) const {
  if (!options_.send_outcomes) return;
  wire::RoomOutcomeMessage message;
  message.room = room;
  message.prefill_rank = static_cast<uint32_t>(
      identity_.status_rank >= 0 ? identity_.status_rank : identity_.prefill_tp_rank);
  message.bytes = bytes;
  message.copies = copies;
  message.cause = std::string(FailureCauseLabel(cause));
  // One line, within the frame's bound: a control byte becomes a space, the rest is cut.
  message.reason = reason.substr(0, wire::kMaxOutcomeReasonBytes);
  for (char& c : message.reason) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  absl::StatusOr<std::vector<std::string>> frames = wire::BuildRoomOutcome(message);
  if (!frames.ok()) return;  // every field above fits
  out.messages.push_back(OutboundMessage{endpoint, *std::move(frames)});
}

void PrefillRooms::SendStatus(uint64_t room, const std::string& endpoint, wire::StatusForm form,
                              TransferPoll status, const RoomReady* ready,
                              PrefillOutput& out) const {
  wire::StatusMessage message;
  message.room = room;
  message.status = TransferPollCode(status);
  message.prefill_rank = static_cast<uint32_t>(
      identity_.status_rank >= 0 ? identity_.status_rank : identity_.prefill_tp_rank);
  if (ready != nullptr) {
    message.bootstrap_token = ready->bootstrap_token;
    message.spec_candidate_ids = ready->spec_candidate_ids;
    message.cached_tokens = ready->cached_tokens;
    message.bootstrap_logprob = ready->first_token_logprob;
  }
  absl::StatusOr<std::vector<std::string>> frames = wire::BuildStatus(message, form);
  // Rooms come from parsed frames or BeginRoom (both <= 2^63-1), ranks from Create (<= 1023),
  // and tokens, cached tokens and logprobs from Ready, which checks them as ParseStatus does:
  // BuildStatus accepts all of them.
  if (!frames.ok()) return;
  out.messages.push_back(OutboundMessage{endpoint, *std::move(frames)});
}

// --- room state ---------------------------------------------------------------------------

void PrefillRooms::SetState(uint64_t room_id, Room& room, TransferPoll state, absl::Time now,
                            PrefillOutput& out) {
  // Every change goes through the role's transition table (room_transitions.h).
  bool unlisted = false;
  const std::optional<TransferPoll> moved =
      NextRoomState(LedgerRole::kPrefill, room.state, state, &unlisted);
  if (unlisted) ++unlisted_moves_;
  if (!moved) return;
  const TransferPoll next = *moved;
  room.state = next;
  RoomEvent event;
  event.room = room_id;
  event.state = next;
  if (next == TransferPoll::kFailed) {
    event.reason = room.failure_reason;
    event.cause = room.failure_cause;
  }
  if (next == TransferPoll::kFailed || next == TransferPoll::kSuccess) {
    // Exactly one terminal event per room: remembered here, a second is never made. A failed
    // room is remembered at least failed_room_ttl, to answer late pre-allocations (§11.2).
    const absl::Time keep_until =
        next == TransferPoll::kFailed ? now + options_.timeouts.failed_room_ttl : now;
    if (!ended_.Remember(event, now, keep_until, room.unproven_sessions)) return;
  }
  out.events.push_back(std::move(event));
}

void PrefillRooms::AbortRoom(uint64_t room_id, Room& room, FailureCause cause, std::string reason,
                             absl::Time now, PrefillOutput& out) {
  if (room.state == TransferPoll::kFailed) return;
  if (room.transfers.has_value()) {
    // Failed means fenced: the Failed goes out once no write of the room can land any more
    // (EndTransfers).
    if (room.transfers->phase != TransferPhase::kFencing) out.fences.push_back(room_id);
    FenceTransfers(room_id, room, cause, std::move(reason), "", now, out);
    return;
  }
  if (!room.begun && !room.state.has_value() && room.destinations.empty()) room.first_seen = now;
  room.failure_reason = std::move(reason);
  room.failure_cause = cause;
  for (const Destination& d : room.destinations) {
    if (!d.peer->dummy) {
      SendOutcome(room_id, d.peer->reply_endpoint, 0, 0, room.failure_cause, room.failure_reason,
                  out);
      SendStatus(room_id, d.peer->reply_endpoint, StatusFormFor(d.peer->contract.revision),
                 TransferPoll::kFailed, nullptr, out);
    }
  }
  DropDestinations(room);
  room.ready.reset();
  if (!room.begun) room.forget_at = now + options_.timeouts.failed_room_ttl;
  SetState(room_id, room, TransferPoll::kFailed, now, out);
}

void PrefillRooms::MaybeStartTransfer(uint64_t room_id, Room& room, absl::Time now,
                                      PrefillOutput& out) {
  // A fencing room (failed with a layer's work in flight) sends nothing more: its Failed waits
  // only for the fence.
  if (room.transfer_started ||
      (room.transfers.has_value() && room.transfers->phase == TransferPhase::kFencing) ||
      room.state != TransferPoll::kBootstrapped) {
    return;
  }
  const bool final = room.ready.has_value();
  if (!final && room.layers_final <= room.layers_sent) return;  // no new layer is final
  const layout::Manifest* source = room.layer_source.get();
  if (final && room.ready->source_manifest.has_value()) source = &*room.ready->source_manifest;
  const plan::CopyPlan::LayerRange layers{room.layers_sent, final ? INT64_MAX : room.layers_final};
  absl::StatusOr<TransferWork> work = BuildTransfer(room_id, room, source, layers, now);
  if (!work.ok()) {
    AbortRoom(room_id, room, FailureCauseOf(work.status()), Owned(work.status().message()), now,
              out);
    return;
  }
  room.layers_sent = layers.end;
  if (work->destinations.empty()) {
    // A dummy rank: nothing to copy and nobody to tell (§1.4), whatever its layers.
    if (!final) return;
    room.transfer_started = true;
    DropDestinations(room);
    SetState(room_id, room, TransferPoll::kSuccess, now, out);
    return;
  }
  for (const TransferDestination& d : work->destinations) {
    room.bytes_by_session[d.peer->registration.session_id] += d.bytes;
  }
  room.transfer_started = final;
  if (!room.transfers.has_value()) {
    room.transfers.emplace(now);
    ++rooms_transferring_;
  }
  work->generation = next_generation_++;
  room.transfers->preparing.insert(work->generation);
  room.transfers->final = room.transfers->final || final;
  room.transfers->bytes += work->total_bytes;
  out.transfers.push_back(*std::move(work));
}

absl::StatusOr<TransferWork> PrefillRooms::BuildTransfer(uint64_t room_id, const Room& room,
                                                         const layout::Manifest* source,
                                                         plan::CopyPlan::LayerRange layers,
                                                         absl::Time now) const {
  TransferWork work;
  work.room = room_id;
  work.layers = layers;
  work.final = layers.end == INT64_MAX;
  uint64_t room_bytes = 0;  // every layer's, for the cap
  for (const Destination& d : room.destinations) {
    if (d.peer->dummy) continue;
    const std::string& session_id = d.peer->registration.session_id;
    if (Quarantined(session_id, now)) {
      return absl::UnavailableError(absl::StrCat(
          "CachePD transfer failed: Decode session ", session_id,
          " is quarantined after a failed transfer (CACHEPD §7.4 FAILED_SESSION_TTL)"));
    }
    if (source == nullptr) {
      return absl::FailedPreconditionError(
          "CachePD transfer failed: the engine gave no source manifest for a room with data "
          "destinations");
    }
    if (work.source_manifest == nullptr) {
      absl::Status valid = layout::ValidateManifest(*source, identity_.contract);
      if (!valid.ok()) {
        return AddContext(valid, "CachePD transfer failed: source manifest");
      }
      work.source_manifest = room.layer_source != nullptr && source == room.layer_source.get()
                                 ? room.layer_source
                                 : std::make_shared<const layout::Manifest>(*source);
    }
    KVRAIL_RETURN_IF_ERROR(AddContext(CheckPairs(*work.source_manifest, *d.manifest, session_id),
                                      "CachePD transfer failed"));
    TransferDestination destination{
        d.peer, d.manifest, PlannedBytes(*d.peer->copy_plan, *work.source_manifest, layers)};
    room_bytes += layers.begin <= 0 && work.final
                      ? destination.bytes
                      : PlannedBytes(*d.peer->copy_plan, *work.source_manifest);
    work.total_bytes += destination.bytes;
    work.destinations.push_back(std::move(destination));
  }
  if (options_.max_room_bytes > 0 && room_bytes > options_.max_room_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("room ", room_id, " would copy ", room_bytes,
                                                     " bytes, over the per-room cap of ",
                                                     options_.max_room_bytes, " bytes"));
  }
  return work;
}

bool PrefillRooms::Quarantined(absl::string_view session_id, absl::Time now) const {
  auto found = quarantine_.find(session_id);
  return found != quarantine_.end() && now < found->second;
}

// --- engine -------------------------------------------------------------------------------

absl::StatusOr<PrefillOutput> PrefillRooms::BeginRoom(uint64_t room_id, absl::Time now,
                                                      bool announce) {
  if (room_id > wire::kMaxRoom) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, " is above 2^63-1 (CACHEPD Terminology)"));
  }
  KVRAIL_RETURN_IF_ERROR(EndedRefusal(room_id));
  PrefillOutput out;
  Room& room = rooms_[room_id];
  if (!room.begun) {
    if (!room.state.has_value() && room.destinations.empty()) room.first_seen = now;
    room.begun = true;
    room.announce = announce;
    room.begun_at = now;
    room.forget_at.reset();  // the engine holds the room now and frees it
    SetState(room_id, room, TransferPoll::kBootstrapping, now, out);
  }
  if (out.events.empty()) {
    RoomEvent event;
    event.room = room_id;
    event.state = *room.state;
    if (event.state == TransferPoll::kBootstrapped) FillBootstrapped(room, event);
    out.events.push_back(std::move(event));
  }
  return out;
}

std::vector<DecodeWindow> PrefillRooms::Windows(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || found->second.state != TransferPoll::kBootstrapped) return {};
  return WindowsOf(found->second);
}

void PrefillRooms::FillBootstrapped(Room& room, RoomEvent& event) {
  event.windows = WindowsOf(room);
  event.announce = room.announce;
  room.announce = false;
}

std::vector<DecodeWindow> PrefillRooms::WindowsOf(const Room& room) {
  std::vector<DecodeWindow> windows;
  for (const Destination& destination : room.destinations) {
    if (destination.manifest == nullptr) continue;  // a dummy: no data
    const wire::Registration& registration = destination.peer->registration;
    windows.push_back({registration.session_id, registration.decode_tp_rank,
                       destination.manifest->prefix_len, destination.manifest->prompt_len});
  }
  return windows;
}

absl::Status PrefillRooms::EndedRefusal(uint64_t room_id) const {
  KVRAIL_RETURN_IF_ERROR(ended_.Refusal(room_id));
  // Ended, not freed, and its end no longer remembered (the newest remembered_rooms are).
  auto found = rooms_.find(room_id);
  if (found != rooms_.end() && Ended(found->second)) {
    return EndedRoomError(room_id, *found->second.state, found->second.failure_reason);
  }
  return absl::OkStatus();
}

bool PrefillRooms::Ended(const Room& room) {
  return room.state == TransferPoll::kFailed || room.state == TransferPoll::kSuccess;
}

absl::Status PrefillRooms::CheckWindows(uint64_t room_id, const Room& room,
                                        const layout::Manifest& source) {
  for (const Destination& destination : room.destinations) {
    if (destination.manifest == nullptr) continue;  // a dummy: no window
    const layout::Manifest& window = *destination.manifest;
    if (window.prefix_len == source.prefix_len && window.prompt_len == source.prompt_len) continue;
    const wire::Registration& registration = destination.peer->registration;
    return MakeError(
        ErrorCategory::kInvalidManifest,
        absl::StrCat("room ", room_id, ": the source manifest covers the window [",
                     source.prefix_len, ", ", source.prompt_len, "), but Decode session ",
                     registration.session_id, " (decode TP rank ", registration.decode_tp_rank,
                     ") pre-allocated [", window.prefix_len, ", ", window.prompt_len,
                     ") (CACHEPD §6.9): refused, the room is unchanged"));
  }
  return absl::OkStatus();
}

absl::Status CheckRoomReady(uint64_t room, const RoomReady& ready) {
  if (ready.bootstrap_token < wire::kNoBootstrapToken) {
    return absl::InvalidArgumentError(absl::StrCat("room ", room, ": bootstrap token ",
                                                   ready.bootstrap_token,
                                                   " must be -1 (none) or non-negative"));
  }
  const int64_t max_cached = ready.source_manifest.has_value() ? ready.source_manifest->prompt_len
                                                               : wire::kMaxCachedTokens;
  if (ready.cached_tokens < 0 || ready.cached_tokens > max_cached) {
    return absl::InvalidArgumentError(absl::StrCat(
        "room ", room, ": cached_tokens ", ready.cached_tokens, " must lie in [0, ", max_cached,
        ready.source_manifest.has_value() ? "], the prompt length (CACHEPD §12.9)"
                                          : "] (CACHEPD §12.9)"));
  }
  if (ready.first_token_logprob.has_value() &&
      (std::isnan(*ready.first_token_logprob) || *ready.first_token_logprob == HUGE_VAL)) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room, ": first_token_logprob ", *ready.first_token_logprob,
                     " is not a log-probability (NaN and +inf are refused; CACHEPD §12.9)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefillOutput> PrefillRooms::Ready(uint64_t room_id, RoomReady ready,
                                                  absl::Time now) {
  KVRAIL_RETURN_IF_ERROR(EndedRefusal(room_id));
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.begun) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " was never begun"));
  }
  Room& room = found->second;
  KVRAIL_RETURN_IF_ERROR(CheckRoomReady(room_id, ready));
  if (room.ready.has_value() || room.transfer_started) {
    return absl::FailedPreconditionError(absl::StrCat("room ", room_id, " is already ready"));
  }
  if (room.layer_source != nullptr && ready.source_manifest.has_value() &&
      !SameManifest(*ready.source_manifest, *room.layer_source)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "room ", room_id, ": the source manifest differs from the one its LayersReady gave"));
  }
  if (ready.source_manifest.has_value()) {
    KVRAIL_RETURN_IF_ERROR(CheckWindows(room_id, room, *ready.source_manifest));
  }
  PrefillOutput out;
  room.ready = std::move(ready);
  MaybeStartTransfer(room_id, room, now, out);
  return out;
}

absl::StatusOr<PrefillOutput> PrefillRooms::LayersReady(
    uint64_t room_id, std::optional<layout::Manifest> source_manifest, int64_t layers,
    absl::Time now) {
  KVRAIL_RETURN_IF_ERROR(EndedRefusal(room_id));
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.begun) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " was never begun"));
  }
  Room& room = found->second;
  if (room.ready.has_value() || room.transfer_started) {
    return absl::FailedPreconditionError(
        absl::StrCat("room ", room_id, " is already ready: its layers were all sent"));
  }
  for (const layout::FieldLayout& field : identity_.contract.plan.fields) {
    absl::StatusOr<int64_t> layer = plan::FieldLayer(field.field_id);
    if (!layer.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "room ", room_id,
          ": this rank's contract cannot stream by layer: ", layer.status().message()));
    }
  }
  if (layers < 1 || layers < room.layers_final) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, ": layers ", layers,
                     " must be >= 1 and never below an earlier call's (", room.layers_final, ")"));
  }
  if (room.layer_source != nullptr && source_manifest.has_value() &&
      !SameManifest(*source_manifest, *room.layer_source)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "room ", room_id, ": the source manifest differs from the one its first LayersReady gave"));
  }
  if (room.layer_source == nullptr && !source_manifest.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, ": the first LayersReady must give the source manifest"));
  }
  if (source_manifest.has_value()) {
    KVRAIL_RETURN_IF_ERROR(CheckWindows(room_id, room, *source_manifest));
  }
  PrefillOutput out;
  if (room.layer_source == nullptr) {
    room.layer_source = std::make_shared<const layout::Manifest>(*std::move(source_manifest));
  }
  room.layers_final = layers;
  MaybeStartTransfer(room_id, room, now, out);
  return out;
}

// --- transfer layer -----------------------------------------------------------------------

std::vector<uint64_t> PrefillRooms::TransfersPrepared(uint64_t room_id, uint64_t generation,
                                                      const std::vector<std::string>& sessions,
                                                      absl::Time now, PrefillOutput& out) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.transfers.has_value() ||
      found->second.transfers->preparing.erase(generation) == 0) {
    return {};  // stale: the room ended, or this work was never its
  }
  Room& room = found->second;
  Transfers& transfers = *room.transfers;
  if (transfers.phase == TransferPhase::kFencing || sessions.empty()) {
    // Failed while it was prepared (nothing of this work is submitted), or nothing to move.
    EndTransfersIfDone(room_id, room, now, out);
    return {};
  }
  transfers.phase = TransferPhase::kPosting;
  std::vector<uint64_t> ids;
  ids.reserve(sessions.size());
  for (const std::string& session : sessions) {
    const uint64_t id = next_transfer_id_++;
    ids.push_back(id);
    transfers.ids.push_back(id);
    transfer_owners_[id] = TransferOwner{room_id, session};
  }
  return ids;
}

PrefillOutput PrefillRooms::PreparationFailed(uint64_t room_id, uint64_t generation,
                                              absl::string_view reason, absl::string_view blame,
                                              FailureCause cause, absl::Time now) {
  PrefillOutput out;
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.transfers.has_value() ||
      found->second.transfers->preparing.erase(generation) == 0) {
    return out;
  }
  FenceTransfers(room_id, found->second, cause, absl::StrCat("CachePD transfer failed: ", reason),
                 std::string(blame), now, out);
  return out;
}

PrefillOutput PrefillRooms::TransfersSubmitted(uint64_t room_id) {
  PrefillOutput out;
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.transfers.has_value()) return out;
  const Transfers& transfers = *found->second.transfers;
  if (transfers.phase == TransferPhase::kFencing) out.cancels = transfers.ids;
  return out;
}

PrefillOutput PrefillRooms::TransferOutcome(uint64_t transfer_id, const absl::Status& status,
                                            absl::string_view blame, absl::Time now,
                                            bool fence_proven, uint64_t copies) {
  PrefillOutput out;
  auto owner = transfer_owners_.find(transfer_id);
  if (owner == transfer_owners_.end()) return out;
  const uint64_t room_id = owner->second.room;
  const std::string session = std::move(owner->second.session);
  transfer_owners_.erase(owner);
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.transfers.has_value()) return out;
  Room& room = found->second;
  Transfers& transfers = *room.transfers;
  transfers.ids.erase(std::remove(transfers.ids.begin(), transfers.ids.end(), transfer_id),
                      transfers.ids.end());
  if (!fence_proven) room.unproven_sessions.insert(session);
  transfers.copies += copies;
  transfers.copies_by_session[session] += copies;
  if (!status.ok() && transfers.phase != TransferPhase::kFencing) {
    // A write failed: the siblings stop too, and the session it blames is quarantined.
    FenceTransfers(room_id, room, FailureCauseOf(status),
                   absl::StrCat("CachePD transfer failed: ", status.ToString()), std::string(blame),
                   now, out);
    return out;
  }
  EndTransfersIfDone(room_id, room, now, out);
  return out;
}

std::string PrefillRooms::SessionOfTransfer(uint64_t transfer_id) const {
  auto found = transfer_owners_.find(transfer_id);
  return found == transfer_owners_.end() ? std::string() : found->second.session;
}

std::shared_ptr<const std::atomic<bool>> PrefillRooms::FailingFlag(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || !found->second.transfers.has_value()) return nullptr;
  return found->second.transfers->failing;
}

void PrefillRooms::FenceTransfers(uint64_t room_id, Room& room, FailureCause cause,
                                  std::string reason, std::string blame, absl::Time now,
                                  PrefillOutput& out) {
  Transfers& transfers = *room.transfers;
  if (transfers.phase != TransferPhase::kFencing) {
    transfers.phase = TransferPhase::kFencing;
    transfers.failing->store(true);
    transfers.blame = std::move(blame);
    room.failure_reason = std::move(reason);
    room.failure_cause = cause;
    out.cancels.insert(out.cancels.end(), transfers.ids.begin(), transfers.ids.end());
  }
  EndTransfersIfDone(room_id, room, now, out);
}

void PrefillRooms::EndTransfersIfDone(uint64_t room_id, Room& room, absl::Time now,
                                      PrefillOutput& out) {
  const Transfers& transfers = *room.transfers;
  if (!transfers.ids.empty()) return;  // something of it may still write
  if (transfers.phase == TransferPhase::kFencing ||
      (transfers.final && transfers.preparing.empty())) {
    EndTransfers(room_id, room, now, out);
  }
}

void PrefillRooms::EndTransfers(uint64_t room_id, Room& room, absl::Time now, PrefillOutput& out) {
  Transfers transfers = *std::move(room.transfers);
  room.transfers.reset();
  --rooms_transferring_;
  const bool landed = transfers.phase != TransferPhase::kFencing;
  const size_t events_before = out.events.size();
  if (landed) {
    for (const Destination& d : room.destinations) {
      if (d.peer->dummy) continue;
      const std::string& session = d.peer->registration.session_id;
      auto bytes = room.bytes_by_session.find(session);
      auto copies = transfers.copies_by_session.find(session);
      SendOutcome(room_id, d.peer->reply_endpoint,
                  bytes == room.bytes_by_session.end() ? 0 : bytes->second,
                  copies == transfers.copies_by_session.end() ? 0 : copies->second,
                  FailureCause::kNone, "", out);
      SendStatus(room_id, d.peer->reply_endpoint, StatusFormFor(d.peer->contract.revision),
                 TransferPoll::kSuccess, &*room.ready, out);
    }
    DropDestinations(room);
    room.ready.reset();
    SetState(room_id, room, TransferPoll::kSuccess, now, out);
  } else {
    if (!transfers.blame.empty() && options_.timeouts.failed_session_ttl > absl::ZeroDuration()) {
      quarantine_[transfers.blame] = now + options_.timeouts.failed_session_ttl;
    }
    std::string reason = std::move(room.failure_reason);
    AbortRoom(room_id, room, room.failure_cause, std::move(reason), now, out);
    for (const std::string& session : room.fence_waiters) {
      AnswerFence(room_id, session, room.unproven_sessions.count(session) == 0, out);
    }
    room.fence_waiters.clear();
  }
  for (size_t i = events_before; i < out.events.size(); ++i) {
    RoomEvent& event = out.events[i];
    if (event.room != room_id) continue;
    event.bytes = landed ? transfers.bytes : 0;
    event.copies = transfers.copies;
    event.elapsed = now - transfers.started;
  }
}

std::optional<std::string> PrefillRooms::DropSession(absl::string_view session_id,
                                                     absl::string_view reason, absl::Time now,
                                                     PrefillOutput& out, FailureCause cause) {
  auto found = registrations_.find(session_id);
  if (found == registrations_.end()) return std::nullopt;
  std::string endpoint = found->second->reply_endpoint;
  AbortRoomsOfSession(session_id, cause, reason, now, out);
  registrations_.erase(found);
  quarantine_.erase(std::string(session_id));
  return endpoint;
}

PrefillOutput PrefillRooms::AbortBegunRooms(absl::string_view reason, absl::Time now) {
  PrefillOutput out;
  std::vector<uint64_t> begun;
  for (const auto& [id, room] : rooms_) {
    if (room.begun && room.state != TransferPoll::kFailed && room.state != TransferPoll::kSuccess) {
      begun.push_back(id);
    }
  }
  std::sort(begun.begin(), begun.end());
  for (uint64_t id : begun)
    AbortRoom(id, rooms_[id], FailureCause::kEngine, Owned(reason), now, out);
  return out;
}

PrefillOutput PrefillRooms::Abort(uint64_t room_id, absl::string_view reason, absl::Time now) {
  PrefillOutput out;
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) {
    // Nothing is made for a room nobody has named: a pre-allocation that comes later makes it
    // afresh, and it fails at its unmatched-pre-allocation timeout unless the engine begins it.
    out.rejected = absl::NotFoundError(
        absl::StrCat("Abort of room ", room_id, ": no such room here; nothing to abort"));
    return out;
  }
  AbortRoom(room_id, found->second, FailureCause::kAborted, Owned(reason), now, out);
  return out;
}

size_t PrefillRooms::room_count() const {
  size_t unheld = 0;  // failed, never begun, not freed: forgotten at forget_at
  for (const auto& [id, room] : rooms_) unheld += room.forget_at.has_value() ? 1 : 0;
  return rooms_.size() - unheld;
}

absl::StatusOr<PrefillRooms::Room*> PrefillRooms::DestinationRoom(
    uint64_t room_id, absl::string_view reply_endpoint) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) {
    return absl::NotFoundError(absl::StrCat("room ", room_id, " is not tracked"));
  }
  Room& room = found->second;
  const bool destination =
      std::any_of(room.destinations.begin(), room.destinations.end(),
                  [&](const Destination& d) { return d.peer->reply_endpoint == reply_endpoint; });
  if (!destination) {
    return absl::InvalidArgumentError(
        absl::StrCat("room ", room_id, " has no destination at ", reply_endpoint));
  }
  return &room;
}

template <typename T>
absl::Status PrefillRooms::KeepFor(uint64_t room_id, absl::string_view reply_endpoint,
                                   absl::flat_hash_map<std::string, T> Room::*kept, T value) {
  KVRAIL_ASSIGN_OR_RETURN(Room * room, DestinationRoom(room_id, reply_endpoint));
  (room->*kept)[reply_endpoint] = std::move(value);
  return absl::OkStatus();
}

template <typename T>
std::optional<T> PrefillRooms::TakeFor(uint64_t room_id, absl::string_view reply_endpoint,
                                       absl::flat_hash_map<std::string, T> Room::*kept) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return std::nullopt;
  auto taken = (found->second.*kept).extract(reply_endpoint);
  return taken.empty() ? std::nullopt : std::optional<T>(std::move(taken.mapped()));
}

absl::Status PrefillRooms::KeepSentDigest(uint64_t room_id, absl::string_view reply_endpoint,
                                          uint64_t digest) {
  return KeepFor(room_id, reply_endpoint, &Room::sent_digests, digest);
}

std::optional<uint64_t> PrefillRooms::TakeSentDigest(uint64_t room_id,
                                                     absl::string_view reply_endpoint) {
  return TakeFor(room_id, reply_endpoint, &Room::sent_digests);
}

absl::Status PrefillRooms::KeepStagingAnswer(uint64_t room_id, absl::string_view reply_endpoint,
                                             bool staged) {
  return KeepFor(room_id, reply_endpoint, &Room::staging_answers, staged);
}

std::optional<bool> PrefillRooms::TakeStagingAnswer(uint64_t room_id,
                                                    absl::string_view reply_endpoint) {
  return TakeFor(room_id, reply_endpoint, &Room::staging_answers);
}

void PrefillRooms::Free(uint64_t room_id, absl::Time /*now*/) {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || found->second.transfers.has_value()) return;
  // What answers a late pre-allocation or fence request is remembered apart (ended_, §11.2).
  DropDestinations(found->second);
  rooms_.erase(found);
}

PrefillOutput PrefillRooms::Tick(absl::Time now) {
  PrefillOutput out;
  std::vector<uint64_t> bootstrap_expired;
  std::vector<uint64_t> unmatched;
  std::vector<uint64_t> forget;
  for (const auto& [id, room] : rooms_) {
    if (room.forget_at.has_value()) {
      if (now >= *room.forget_at) forget.push_back(id);
    } else if (room.begun) {
      if (room.state == TransferPoll::kBootstrapping &&
          now - room.begun_at >= options_.timeouts.bootstrap_timeout) {
        bootstrap_expired.push_back(id);
      }
    } else if (room.state != TransferPoll::kFailed &&
               now - room.first_seen >= options_.timeouts.unmatched_preallocation_timeout) {
      unmatched.push_back(id);
    }
  }
  for (uint64_t id : forget) {
    DropDestinations(rooms_[id]);
    rooms_.erase(id);
  }
  ended_.Expire(now);
  std::sort(bootstrap_expired.begin(), bootstrap_expired.end());
  std::sort(unmatched.begin(), unmatched.end());
  for (uint64_t id : bootstrap_expired) {
    AbortRoom(
        id, rooms_[id], FailureCause::kTimeout,
        absl::StrCat("bootstrap timeout: room still Bootstrapping ",
                     absl::FormatDuration(now - rooms_[id].begun_at), " after it began (limit ",
                     absl::FormatDuration(options_.timeouts.bootstrap_timeout), ", CACHEPD §7.4)"),
        now, out);
  }
  for (uint64_t id : unmatched) {
    AbortRoom(id, rooms_[id], FailureCause::kTimeout,
              absl::StrCat("pre-allocations unmatched by a prefill request for ",
                           absl::FormatDuration(now - rooms_[id].first_seen), " (limit ",
                           absl::FormatDuration(options_.timeouts.unmatched_preallocation_timeout),
                           ", CACHEPD §11.2)"),
              now, out);
  }
  for (auto it = quarantine_.begin(); it != quarantine_.end();) {
    if (now >= it->second) {
      quarantine_.erase(it++);
    } else {
      ++it;
    }
  }
  return out;
}

// --- views --------------------------------------------------------------------------------

std::optional<TransferPoll> PrefillRooms::State(uint64_t room) const {
  auto found = rooms_.find(room);
  if (found == rooms_.end()) return std::nullopt;
  return found->second.state;
}

bool PrefillRooms::Begun(uint64_t room) const {
  auto found = rooms_.find(room);
  return found != rooms_.end() && found->second.begun;
}

std::optional<PrefillRoomView> PrefillRooms::Find(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return std::nullopt;
  const Room& room = found->second;
  PrefillRoomView view;
  view.state = room.state;
  view.failure_reason = room.failure_reason;
  view.failure_cause = room.failure_cause;
  for (const Destination& d : room.destinations) {
    view.preallocated_sessions.push_back(d.peer->registration.session_id);
  }
  view.begun = room.begun;
  view.ready = room.ready.has_value() || room.transfer_started;
  if (room.transfers.has_value()) {
    view.transfer = room.transfers->phase;
    view.preparing.assign(room.transfers->preparing.begin(), room.transfers->preparing.end());
    view.transfer_ids = room.transfers->ids;
  }
  view.layers_final = room.layers_final;
  view.layers_sent = room.layers_sent;
  return view;
}

std::shared_ptr<const DecodePeer> PrefillRooms::Registration(absl::string_view session_id) const {
  auto found = registrations_.find(session_id);
  return found == registrations_.end() ? nullptr : found->second;
}

std::vector<std::shared_ptr<const DecodePeer>> PrefillRooms::Registrations() const {
  std::vector<std::shared_ptr<const DecodePeer>> peers;
  peers.reserve(registrations_.size());
  for (const auto& [session, peer] : registrations_) peers.push_back(peer);
  std::sort(peers.begin(), peers.end(), [](const auto& a, const auto& b) {
    return a->registration.session_id < b->registration.session_id;
  });
  return peers;
}

std::vector<std::pair<std::string, wire::ReplyRoute>> PrefillRooms::RejectedSessions() const {
  std::vector<std::pair<std::string, wire::ReplyRoute>> out;
  out.reserve(rejected_.size());
  for (const auto& [session, rejection] : rejected_) out.emplace_back(session, rejection.route);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

std::vector<std::string> PrefillRooms::QuarantinedSessions(absl::Time now) const {
  std::vector<std::string> out;
  for (const auto& [session, until] : quarantine_) {
    if (now < until) out.push_back(session);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kvrail::session
