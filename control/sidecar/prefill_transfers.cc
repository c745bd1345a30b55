// Ready and Abort on a prefill: preparing, submitting and fencing a room's transfers
// (prefill_sidecar.h). The room's entry in PrefillRooms owns their lifecycle (TransferPhase); this
// file does what it decides.
//
//   Ready -> PrefillRooms hands back the room's TransferWork -> BeginTransferLocked prepares each
//   destination: on the owner when its route is warm and its copies are streamed, else as a job
//   in that session's strand (descriptor fetch, connect, copy expansion) -> the last one prepared
//   posts to the owner, which reports TransfersPrepared and submits the transfer ids it returns
//   (none when the room failed meanwhile): a small room's itself, a larger room's on `effects`
//   -> the scheduler's outcomes (a failure only once fenced) go to TransferOutcome -> the room
//   ends: PrefillRooms sends Success, or Failed.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "control/plan/copy_stream.h"
#include "control/plan/room_digest.h"
#include "control/session/ended_room.h"
#include "control/sidecar/prefill_sidecar.h"
#include "control/wire/row_staging.h"
#include "engine/base/error.h"
#include "engine/base/packed_destination.h"

namespace kvrail::sidecar {

// One destination's part of a room, once prepared.
struct PreparedTransfer {
  std::string session;
  transfer::Transfer request;
  absl::Status error;  // the preparation's, if it failed
  // Its cause: the handshake's or connect's when the session's link could not be had, else the
  // status code's (session::FailureCauseOf).
  session::FailureCause cause = session::FailureCause::kNone;
  // --verify-digest, to a kvrail session: the room digest of the bytes it is sent, for the
  // message before its Success (SendLocked), keyed by the registration's reply endpoint.
  std::optional<uint64_t> digest;
  std::string reply_endpoint;
  // Row staging: the answer to the session's staging offer, for the message before its Success
  // (true: the rows went to the slot); nullopt when it offered none.
  std::optional<bool> staged;
  // A strand's preparation: the link it fetched, and PrefillSidecar::link_drops when it began.
  // The owner keeps the link warm unless a link was dropped meanwhile (one prepared on the
  // owner is warm already).
  std::optional<transfer::PeerLink> link;
  uint64_t link_drops = 0;
};

// The most copies a room's transfer may have for the owner to submit it (SubmitPreparedLocked):
// a few pages of whole-page copies, or one layer of a layer-wise room's whole pages (2 fields x
// 256 pages at 4k tokens). Its Submit is then tens of microseconds.
constexpr uint64_t kOwnerSubmitCopies = 1024;

// A room's destinations being prepared: on the owner (a warm route) or in its session's strand.
struct Preparation {
  uint64_t room = 0;
  uint64_t generation = 0;
  std::vector<PreparedTransfer> destinations;
  std::atomic<size_t> remaining{0};
};

// What preparing one destination needs, copied out of the owner's tables for the strand.
struct DestinationJob {
  std::shared_ptr<const session::DecodePeer> owner;  // the registration: route, contract, plan
  std::shared_ptr<const layout::Manifest> source_manifest, destination_manifest;
  plan::CopyPlan::LayerRange layers;
  uint64_t remote_base = 0;   // B_dst, frame 4 (CACHEPD §6.9)
  uint64_t arena_length = 0;  // the decode's arena
  bool digest = false;        // hashed for --verify-digest
  // Row staging: the decode's offer of a slot for the room (wire/row_staging.h), taken by the
  // room's first work to it, and whether this work is the whole room (not layer-wise) and so
  // may take it.
  std::optional<wire::StagingOffer> offer;
  bool whole_room = true;
};

absl::Status PrefillSidecar::Ready(const v1::Ready& ready) {
  const std::string context = absl::StrCat("Ready room ", ready.room());
  session::RoomReady room_ready;
  if (!ready.source_manifest().empty() && ready.block_tables_size() > 0) {
    return absl::InvalidArgumentError(
        context + ": give source_manifest or block_tables (with the window), not both");
  }
  if (!ready.source_manifest().empty()) {
    absl::StatusOr<layout::Manifest> manifest = layout::ParseManifest(ready.source_manifest());
    if (!manifest.ok()) return AddContext(manifest.status(), context + ": source manifest");
    room_ready.source_manifest = *std::move(manifest);
  }
  room_ready.bootstrap_token = ready.bootstrap_token();
  if (ready.speculative_ids_size() > 0) {
    room_ready.spec_candidate_ids =
        std::vector<int32_t>(ready.speculative_ids().begin(), ready.speculative_ids().end());
  }
  // Checked against the prompt length by PrefillRooms::Ready (CACHEPD §12.9).
  room_ready.cached_tokens = ready.cached_tokens();
  if (ready.has_first_token_logprob()) {
    room_ready.first_token_logprob = ready.first_token_logprob();
  }
  return Owned([&]() -> absl::Status {
    if (!attached) return absl::FailedPreconditionError(context + ": attach an arena first");
    if (ready.block_tables_size() > 0) {
      KVRAIL_ASSIGN_OR_RETURN(room_ready.source_manifest,
                              ManifestFromTables(ready.block_tables(), ready.prefix_len(),
                                                 ready.prompt_len(), context + ": block_tables"));
    }
    // Refused before the room is begun, so that a refused Ready stores nothing.
    if (absl::Status checked = session::CheckRoomReady(ready.room(), room_ready); !checked.ok()) {
      return AddContext(checked, context);
    }
    const absl::Time now = RoomNow();
    KVRAIL_RETURN_IF_ERROR(BeginPrefillRoomLocked(ready.room(), now, context));
    absl::StatusOr<session::PrefillOutput> out =
        rooms->Ready(ready.room(), std::move(room_ready), now);
    if (!out.ok()) return AddContext(out.status(), context);
    metrics.RoomReady(ready.room(), absl::Now());  // its first-byte clock starts
    ApplyLocked(*std::move(out));
    return absl::OkStatus();
  });
}

absl::Status PrefillSidecar::Begin(const v1::Begin& begin) {
  const std::string context = absl::StrCat("Begin room ", begin.room());
  return Owned([&]() -> absl::Status {
    if (!attached) return absl::FailedPreconditionError(context + ": attach an arena first");
    // The room's Bootstrapped goes to the engine once, as an event (Publish), whether the last
    // pre-allocation comes after this call or came before it (BeginRoom then reports it).
    absl::StatusOr<session::PrefillOutput> begun =
        rooms->BeginRoom(begin.room(), RoomNow(), /*announce=*/true);
    if (!begun.ok()) return AddContext(begun.status(), context);
    metrics.RoomSeen(begin.room(), absl::Now());
    ApplyLocked(*std::move(begun));
    return absl::OkStatus();
  });
}

absl::Status PrefillSidecar::LayersReady(const v1::LayersReady& layers) {
  const std::string context = absl::StrCat("LayersReady room ", layers.room());
  std::optional<layout::Manifest> source;
  if (!layers.source_manifest().empty()) {
    absl::StatusOr<layout::Manifest> manifest = layout::ParseManifest(layers.source_manifest());
    if (!manifest.ok()) return AddContext(manifest.status(), context + ": source manifest");
    source = *std::move(manifest);
  }
  return Owned([&]() -> absl::Status {
    if (!attached) return absl::FailedPreconditionError(context + ": attach an arena first");
    const absl::Time now = RoomNow();
    KVRAIL_RETURN_IF_ERROR(BeginPrefillRoomLocked(layers.room(), now, context));
    absl::StatusOr<session::PrefillOutput> out =
        rooms->LayersReady(layers.room(), std::move(source), layers.layers(), now);
    if (!out.ok()) return AddContext(out.status(), context);
    ApplyLocked(*std::move(out));
    return absl::OkStatus();
  });
}

absl::Status PrefillSidecar::BeginPrefillRoomLocked(uint64_t room, absl::Time now,
                                                    const std::string& context) {
  absl::StatusOr<session::PrefillOutput> begun = rooms->BeginRoom(room, now);
  if (!begun.ok()) return AddContext(begun.status(), context);
  ApplyLocked(*std::move(begun));
  return absl::OkStatus();
}

// On the owner thread. Failed means fenced: a room with a transfer in flight fails only once no
// write of it can land any more (its cancels, then the outcomes; PrefillRooms decides).
void PrefillSidecar::AbortLocked(uint64_t room, const std::string& reason) {
  ApplyLocked(rooms->Abort(room, reason, RoomNow()));
}

void PrefillSidecar::BeginTransferLocked(session::TransferWork work) {
  AssertOnOwner("BeginTransferLocked");
  auto preparation = std::make_shared<Preparation>();
  preparation->room = work.room;
  preparation->generation = work.generation;
  for (const session::TransferDestination& destination : work.destinations) {
    if (destination.peer->dummy || destination.peer->copy_plan == nullptr) continue;
    preparation->destinations.emplace_back();
  }
  preparation->remaining = preparation->destinations.size();
  // The last destination to be prepared (or, with none, this call) submits the room: posted to
  // the owner, which decides; the submits it defers run on `effects` (PostOwned).
  auto finish = [this, preparation] {
    PostOwned([this, preparation] { SubmitPreparedLocked(preparation); });
  };
  if (preparation->destinations.empty()) {
    finish();
    return;
  }
  // A strand reads these, not the owner's tables: whether the room failed meanwhile (its
  // preparation is then moot), and whether the final work is hashed (--verify-digest, for a
  // kvrail session: one whose key this prefill holds).
  const std::shared_ptr<const std::atomic<bool>> failing = rooms->FailingFlag(work.room);
  size_t index = 0;
  for (const session::TransferDestination& destination : work.destinations) {
    const session::DecodePeer& peer = *destination.peer;
    if (peer.dummy || peer.copy_plan == nullptr) continue;
    LogRouteLocked(destination.peer);
    PreparedTransfer& slot = preparation->destinations[index++];
    slot.session = peer.registration.session_id;
    DestinationJob job;
    job.owner = destination.peer;
    job.source_manifest = work.source_manifest;
    job.destination_manifest = destination.manifest;
    job.layers = work.layers;
    job.remote_base = peer.registration.arena_base;  // B_dst, frame 4 (CACHEPD §6.9)
    job.arena_length = static_cast<uint64_t>(peer.contract.ArenaBytes());
    // --verify-digest, and the session is kvrail's (it has a key): on the room's final work,
    // over the whole room (the decode checks every byte the room landed).
    job.digest = work.final && Hashed(peer);
    job.offer = staging_offers.Take(slot.session, work.room);
    job.whole_room = work.final && work.layers.begin == 0 && work.layers.end == INT64_MAX;
    // A warm route (its link known to the owner, vouched for this registration) whose copies
    // are streamed, neither hashed nor staged, is prepared here: building the stream checks the
    // room's bounds and computes its envelope (no copy is expanded yet), so it costs the owner
    // little and spares the room two hand-offs (to the strand and back). Anything that may wait
    // on the peer (a fetch, a connect) or is proportional to the room's copies goes to the
    // session's strand.
    if (!job.digest && staging == nullptr) {
      if (auto warm = warm_links.find(slot.session); warm != warm_links.end()) {
        const transfer::PeerLink& link = warm->second;
        if (CheckOwner(peer.registration, job.arena_length, link.cachepd_endpoint, *link.regions)
                .ok()) {
          slot.link_drops = link_drops;
          PrepareDestination(*preparation, slot, job, link);
          if (preparation->remaining.fetch_sub(1) == 1) finish();
          continue;
        }
      }
    }
    slot.link_drops = link_drops;
    strands.Post(slot.session, [this, preparation, &slot, job, finish, failing] {
      // Skipped when the room already failed: its preparation is moot.
      if (failing != nullptr && !failing->load()) {
        absl::StatusOr<transfer::PeerLink> link = directory->Get(slot.session);
        // The session's descriptor must vouch for the registration (registration_gate.h: its
        // CachePD endpoint, a region beginning at B_dst that holds the arena), as it did when
        // the registration was admitted. A cached link that does not belongs to an earlier
        // process at the same address (a restarted decode that got its old port back): fetch
        // and connect afresh, once.
        const auto vouched = [&] {
          return CheckOwner(job.owner->registration, job.arena_length, link->cachepd_endpoint,
                            *link->regions);
        };
        if (link.ok() && !vouched().ok()) {
          DropPeer(slot.session, "");
          link = directory->Get(slot.session);
          if (link.ok()) {
            if (absl::Status owned = vouched(); !owned.ok()) link = owned;
          }
        }
        if (!link.ok()) {
          slot.error = link.status();
          slot.cause = session::FailureCause::kHandshake;
        } else {
          slot.link = *link;  // for the owner to keep warm (SubmitPreparedLocked)
          PrepareDestination(*preparation, slot, job, *link);
        }
      }
      if (preparation->remaining.fetch_sub(1) == 1) finish();
    });
  }
}

void PrefillSidecar::PrepareDestination(const Preparation& preparation, PreparedTransfer& slot,
                                        const DestinationJob& job, const transfer::PeerLink& link) {
  slot.reply_endpoint = job.owner->reply_endpoint;
  slot.request.on_batch = metrics.BatchCounter(preparation.room, slot.session, options.lanes);
  slot.request.peer = link.peer;
  slot.request.source = region;
  slot.request.source_length = arena_bytes;
  slot.request.remote = link.regions;
  slot.request.remote_base = job.remote_base;
  slot.request.remote_length = job.arena_length;  // this arena alone, not every region
  slot.request.lanes = LanesFor(*job.owner);
  // The scheduler pulls the copies a chunk at a time as it posts, so the first writes go out
  // before the room's last copy is computed (copy_stream.h), each head-sliced page's rows as one
  // strided copy (issue 31); --naive-copies posts the planner's copies unmerged, one per row,
  // and --no-strided-copies one per row merged where contiguous, for measurement only. A hashed
  // room's digest takes its strided copies row by row (plan::RoomDigest); a staged arena's
  // strided copies go to the mirror as ranges of rows (one 2-D copy a chunk on a GPU).
  const bool staged = staging != nullptr;
  absl::StatusOr<std::unique_ptr<CopySource>> stream =
      plan::StreamRoom(job.owner->copy_plan, job.source_manifest, job.destination_manifest,
                       job.layers, !options.naive_copies, StridedCopies());
  // Row staging: a whole room whose decode offered a slot of exactly its bytes writes its rows
  // there, back to back in the plan's order (packed_destination.h), for the decode to scatter
  // into its pages; anything else (a layer-wise room's works, a slot of another size) writes in
  // place and says so. The slot lies in a region of the session's descriptor, or the
  // scheduler's bounds check refuses the transfer before its first byte.
  if (job.offer && stream.ok()) {
    const uint64_t bytes = (*stream)->envelope().bytes;
    slot.staged = job.whole_room && bytes == job.offer->bytes;
    if (*slot.staged) {
      slot.request.remote_base = job.offer->address;
      slot.request.remote_length = job.offer->bytes;
    } else if (job.whole_room) {
      spdlog::warn(
          "prefill: room {} to {}: the staging slot offered holds {} bytes, the room's rows to "
          "it are {}: written in place",
          preparation.room, slot.session, job.offer->bytes, bytes);
    }
  }
  const bool packed = slot.staged.value_or(false);
  if (!stream.ok()) {
    slot.error = stream.status();
  } else if (!job.digest && !staged) {
    slot.request.stream = packed ? PackDestination(*std::move(stream)) : *std::move(stream);
  } else {
    // Hashing and staging need the list: the stream is drained into one some earlier room
    // used, whose pages are there already (copy_list_pool.h).
    slot.request.copies = copy_lists->Take();
    slot.request.recycle = [pool = copy_lists](plan::CopyList spent) {
      pool->Give(std::move(spent));
    };
    AppendAll(**stream, slot.request.copies);
  }
  // A staged arena: the room's source bytes go to the mirror before any write reads them
  // (arena_staging.cc), and before the digest hashes them there.
  if (slot.error.ok() && staged) slot.error = StageSources(slot.request.copies);
  // The engine's Ready says the source bytes are final, so hashing them here, before the
  // writes, gives what hashing them after the flush would; the writes wait for it, so its cost
  // adds to the room's time (docs/SECURITY.md, "Digests").
  // A listed room's destinations are packed once its digest has its copies (the digest is over
  // the pages' offsets, which the decode hashes once it has scattered the rows).
  const auto pack_listed = [&] {
    if (packed && slot.request.stream == nullptr) PackDestinations(slot.request.copies);
  };
  if (!slot.error.ok() || !job.digest) {
    pack_listed();
    return;
  }
  plan::CopyList sorted = slot.request.copies;  // the writes keep their order
  pack_listed();
  if (job.layers.begin > 0) {  // earlier works sent the first layers: hash them all
    sorted.clear();
    absl::StatusOr<std::unique_ptr<CopySource>> whole =
        plan::StreamRoom(job.owner->copy_plan, job.source_manifest, job.destination_manifest, {},
                         !options.naive_copies, StridedCopies());
    if (!whole.ok()) {
      slot.error = whole.status();
      return;
    }
    AppendAll(**whole, sorted);
  }
  absl::StatusOr<uint64_t> sum = plan::RoomDigest(
      sorted, plan::DigestSide::kSource,
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(arena_base), arena_bytes));
  if (sum.ok()) {
    slot.digest = *sum;
    slot.reply_endpoint = job.owner->reply_endpoint;
  } else {
    slot.error = AddContext(sum.status(), "--verify-digest");
  }
}

void PrefillSidecar::SubmitPreparedLocked(const std::shared_ptr<Preparation>& preparation) {
  const absl::Time now = RoomNow();
  std::vector<std::string> sessions;
  for (const PreparedTransfer& p : preparation->destinations) {
    if (!p.error.ok()) {
      const session::FailureCause cause =
          p.cause != session::FailureCause::kNone ? p.cause : session::FailureCauseOf(p.error);
      ApplyLocked(rooms->PreparationFailed(preparation->room, preparation->generation,
                                           DescribeError(p.error), p.session, cause, now));
      return;
    }
    sessions.push_back(p.session);
    // The route is warm: the session's next room is prepared on the owner. Unless a link was
    // dropped since this preparation began: this one may be the link that went.
    if (p.link && p.link_drops == link_drops) warm_links.insert_or_assign(p.session, *p.link);
  }
  session::PrefillOutput prepared;
  std::vector<uint64_t> ids =
      rooms->TransfersPrepared(preparation->room, preparation->generation, sessions, now, prepared);
  ApplyLocked(std::move(prepared));  // what ended: it failed meanwhile, or nothing to move
  if (ids.empty()) return;
  for (const PreparedTransfer& p : preparation->destinations) {
    // Kept with the room, for the Success to that destination (SendLocked).
    if (p.digest) (void)rooms->KeepSentDigest(preparation->room, p.reply_endpoint, *p.digest);
    if (p.staged) (void)rooms->KeepStagingAnswer(preparation->room, p.reply_endpoint, *p.staged);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    transfer::Transfer& request = preparation->destinations[i].request;
    request.transfer_id = ids[i];
    request.deadline = absl::Now() + options.transfer_deadline;  // the scheduler's clock
    request.done = [this](const transfer::TransferOutcome& outcome) { OnTransferOutcome(outcome); };
  }
  // A small room is submitted here: its Submit checks, queues and posts at most
  // kOwnerSubmitCopies copies, a bounded enqueue on the lanes that never waits (as the outbox's
  // sends are), and spares the room two hand-offs (to `effects` and back). A larger one, whose
  // Submit expands and posts a chunk of thousands of copies, is deferred to `effects`.
  const bool small = std::all_of(preparation->destinations.begin(), preparation->destinations.end(),
                                 [](const PreparedTransfer& p) {
                                   const uint64_t copies = p.request.stream != nullptr
                                                               ? p.request.stream->envelope().copies
                                                               : p.request.copies.size();
                                   return copies <= kOwnerSubmitCopies;
                                 });
  if (small) {
    // Every Submit is made before a refusal is applied: a refusal fails the room, whose cancels
    // must then find its other transfers in flight.
    std::vector<std::pair<uint64_t, absl::Status>> refused;
    for (PreparedTransfer& p : preparation->destinations) {
      const uint64_t id = p.request.transfer_id;
      if (absl::Status submitted = scheduler->Submit(std::move(p.request)); !submitted.ok()) {
        refused.emplace_back(id, std::move(submitted));
      }
    }
    for (const auto& [id, status] : refused) {
      ApplyLocked(rooms->TransferOutcome(id, status, rooms->SessionOfTransfer(id), RoomNow()));
    }
    return;
  }
  Defer([this, preparation, failing = rooms->FailingFlag(preparation->room)] {
    for (PreparedTransfer& p : preparation->destinations) {
      const uint64_t id = p.request.transfer_id;
      const absl::Status submitted = scheduler->Submit(std::move(p.request));
      if (!submitted.ok()) {  // refused before anything was posted
        PostOwned([this, id, submitted, session = p.session] {
          if (!rooms) return;
          ApplyLocked(rooms->TransferOutcome(id, submitted, session, RoomNow()));
        });
      }
    }
    // A room that failed while these were submitted cancels them now (PrefillRooms::
    // TransfersSubmitted). One that had not failed once every Submit returned needs nothing:
    // its failure, later, sets the flag before it decides its cancels, which run after these
    // Submits returned and find what they submitted.
    if (failing != nullptr && failing->load()) {
      PostOwned([this, room = preparation->room] {
        if (rooms) ApplyLocked(rooms->TransfersSubmitted(room));
      });
    }
  });
}

bool PrefillSidecar::Hashed(const session::DecodePeer& peer) const {
  return options.verify_digest && gate.KeyFor(peer.reply_endpoint).has_value();
}

bool PrefillSidecar::StridedCopies() const {
  return !options.naive_copies && !options.no_strided_copies;
}

void PrefillSidecar::LogRouteLocked(const std::shared_ptr<const session::DecodePeer>& peer) {
  std::weak_ptr<const session::DecodePeer>& logged = logged_routes[peer->registration.session_id];
  if (logged.lock() == peer) return;
  logged = peer;
  // The widest row fragment, if any: a mismatched TP's head-sliced rows (CACHEPD §6.8).
  const plan::BoundFragment* widest = nullptr;
  for (const plan::BoundFragment& f : peer->copy_plan->fragments()) {
    if (f.rows > 1 && (widest == nullptr || f.bytes_per_row > widest->bytes_per_row)) widest = &f;
  }
  std::string copies = "whole pages";
  if (widest != nullptr) {
    const transport::Capabilities& caps = transport->capabilities();
    const uint64_t most =
        transport::MaxRowsPerWrite(caps, widest->bytes_per_row, widest->dst_row_stride);
    std::string posted;
    if (!StridedCopies()) {
      posted = "a copy per row (--naive-copies or --no-strided-copies)";
    } else {
      // The plan's strided copies: a page's rows, or the rows of pages that follow each other on
      // both sides (CopyPlan::Begin, coalesced).
      const std::string strided = "a strided copy per run of pages";
      if (caps.strided_writes) {
        posted = strided + ", posted whole";
      } else if (most > 1) {
        posted = absl::StrCat(strided, ", posted as writes gathering up to ", most, " rows each");
      } else {
        posted = absl::StrCat(strided, ", posted a row a write (the transport takes no rows",
                              caps.max_gather_rows > 1 ? " landing apart" : "", ")");
      }
    }
    // Rows that land apart may go back to back into a slot the decode offers for a room (row
    // staging, docs/PROTOCOL.md A.8): such a room says so in the decode's log, room by room.
    const bool land_apart = widest->dst_row_stride > widest->bytes_per_row;
    copies = absl::StrCat("head-sliced rows of ", widest->bytes_per_row, " bytes, ", widest->rows,
                          " a page: ", posted,
                          land_apart ? "; a room the decode offers a staging slot for goes "
                                       "back to back into the slot instead"
                                     : "");
  }
  const transfer::LaneSet lanes = LanesFor(*peer);
  std::string lanes_said = lanes.Describe(transport->capabilities().lanes);
  if (!lanes.Every()) {
    absl::StrAppend(&lanes_said, " (source ", peer->source_index + 1, " of the decode's ",
                    peer->route_sources, ": each decode lane reads one source)");
  }
  spdlog::info(
      "event=route session={} decode_rank={} of {} fragments={} copies=\"{}\" lanes=\"{}\"",
      peer->registration.session_id, peer->registration.decode_tp_rank,
      peer->registration.decode_tp_size, peer->copy_plan->fragments().size(), copies, lanes_said);
}

transfer::LaneSet PrefillSidecar::LanesFor(const session::DecodePeer& peer) const {
  // Where the decode's lane threads receive what the lanes carry (UCX over tcp), a decode that
  // reads several prefill ranks gets each one on lanes of its own (lane_set.h); elsewhere, and
  // for a route of one source, every lane. A layer-wise room's layers keep to them as its
  // whole room does (BENCHMARKS.md, "A decode lane reads one source").
  const transport::Capabilities& caps = transport->capabilities();
  if (!caps.peer_lanes_receive) return transfer::LaneSet{};
  return transfer::WriterLanes(caps.lanes, peer.route_sources, peer.source_index);
}

void PrefillSidecar::ForgetWarmLinkLocked(const std::string& session) {
  warm_links.erase(session);
  ++link_drops;  // and none a preparation begun before now brings back
}

void PrefillSidecar::OnTransferOutcome(const transfer::TransferOutcome& outcome) {
  // A data-plane thread: it hands the outcome to the owner and goes back to the wire.
  PostOwned([this, outcome] {
    if (!rooms) return;  // the arena went away; nobody to tell
    const std::string session = rooms->SessionOfTransfer(outcome.transfer_id);
    const absl::StatusCode code = outcome.status.code();
    if (!outcome.status.ok()) metrics.WriteFailed(outcome.status);
    if (outcome.peer_disconnected || code == absl::StatusCode::kUnavailable) {
      // The link is gone or broken: the next room fetches the descriptor and connects afresh.
      // The owner forgets its warm copy now, and the drop goes to the session's strand, ahead
      // of every later room's preparation there: no room prepared after this outcome posts to
      // the link being disconnected (on the owner's warm copy, or a strand's directory read
      // made before the drop).
      ForgetWarmLinkLocked(session);
      strands.Post(session, [this, session] { DropPeer(session, ""); });
    }
    // A cancel is the room's own doing (an abort, a sibling): nobody to blame for it.
    const std::string blame =
        !outcome.status.ok() && code != absl::StatusCode::kCancelled ? session : "";
    if (!outcome.fence_proven) {
      spdlog::warn(
          "prefill: transfer {} to {} was fenced by a disconnect that does not prove "
          "its writes stopped: {}",
          outcome.transfer_id, session, outcome.status.ToString());
    }
    ApplyLocked(rooms->TransferOutcome(outcome.transfer_id, outcome.status, blame, RoomNow(),
                                       outcome.fence_proven, outcome.stats.copies));
  });
}

void PrefillSidecar::DropPeer(const std::string& session, const std::string& reply_endpoint) {
  std::optional<transport::PeerId> id = directory->Drop(session);
  Owned([&] {
    ForgetWarmLinkLocked(session);
    if (id) forget_peers.push_back(*id);  // the ticker asks the scheduler once it is idle
    if (reply_endpoint.empty() || !rooms) return;
    for (const auto& other : rooms->Registrations()) {
      if (other->reply_endpoint == reply_endpoint) return;  // a live registration's route
    }
    Defer([this, reply_endpoint] { outbox->Forget(reply_endpoint); });
  });
}

}  // namespace kvrail::sidecar
