// Row staging on a decode (decode_sidecar.h; control/wire/row_staging.h; docs/PROTOCOL.md, "Row
// staging"). A route whose rows land apart in this rank's pages (a head-sliced room of a larger
// prefill TP) is a write per row on a transport that cannot land them in one (verbs). With
// --row-staging-bytes, this decode offers each such prefill rank a slot of registered host memory
// for the room, right before the room's pre-allocation; the rank writes the room's rows there
// back to back, one run, and answers "staged" before its Success; the Success then waits, in a
// strand, while the rows are scattered into the pages (the plan's order, plan::LandingCopies),
// and counts only then: Success means landed, in the pages.
//
//   Slots come back: when the rows were scattered; when the rank answered "in_place" (it wrote
//   the pages, never the slot); when the room's pages are released after a fence every rank
//   proved, or were never lent. A room whose fence was not proven keeps its slots out of use
//   for good: a write of it may still land there.
//   A rank that sends Success without answering the offer fails the room: its rows may be in
//   the slot, and a Success counted without them would be wrong KV.
#include "control/wire/row_staging.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "control/plan/landing_copies.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/wire/dispatch.h"
#include "control/wire/preallocation.h"
#include "control/wire/proof.h"
#include "control/wire/status.h"
#include "engine/base/error.h"
#include "engine/transport/landing_copy.h"

namespace kvrail::sidecar {

absl::Status DecodeSidecar::StartRowStaging() {
  if (options.row_staging_bytes == 0) return absl::OkStatus();
  if (staging != nullptr || cuda_arena) {
    spdlog::info(
        "decode rank {}: no row staging: it scatters rows into a host arena the data plane "
        "writes, and this arena is {}",
        options.tp_rank, staging != nullptr ? "staged through a host mirror" : "GPU memory");
    return absl::OkStatus();
  }
  absl::StatusOr<transport::SharedRegion> memory = transport->Allocate(options.row_staging_bytes);
  if (!memory.ok()) {
    return AddContext(memory.status(),
                      absl::StrCat("--row-staging-bytes: allocating ", options.row_staging_bytes,
                                   " bytes on the data plane"));
  }
  Owned([&] {
    row_staging_memory = *std::move(memory);
    row_slots.emplace(row_staging_memory->length);
  });
  spdlog::info(
      "decode rank {}: row staging: {} bytes offered, a slot per room and prefill rank "
      "of a route whose rows land apart ({})",
      options.tp_rank, options.row_staging_bytes,
      options.row_staging == SidecarOptions::RowStaging::kAll
          ? "every such route"
          : "where the transport cannot write them in one write");
  return absl::OkStatus();
}

void DecodeSidecar::StopRowStaging() {
  std::optional<transport::SharedRegion> memory = Owned([&] {
    offered_slots.clear();
    row_slots.reset();
    return std::exchange(row_staging_memory, std::nullopt);
  });
  if (memory) {
    if (absl::Status released = transport->Deregister(memory->region); !released.ok()) {
      spdlog::warn("decode: withdrawing the row staging memory: {}", DescribeError(released));
    }
  }
}

bool DecodeSidecar::RouteStagesRowsLocked(const plan::CopyPlan& landing) const {
  const transport::Capabilities& caps = transport->capabilities();
  for (const plan::BoundFragment& f : landing.fragments()) {
    if (f.rows <= 1 || f.dst_row_stride == f.bytes_per_row) continue;  // rows back to back
    if (options.row_staging == SidecarOptions::RowStaging::kAll) return true;
    if (!caps.lands_rows_apart_whole &&
        static_cast<uint64_t>(f.bytes_per_row) < SidecarOptions::kRowStagingLongestRow) {
      return true;
    }
  }
  return false;
}

void DecodeSidecar::OfferRowStagingLocked(const session::OutboundMessage& m) {
  if (!row_slots || wire::Classify(m.frames) != wire::MessageKind::kPreallocation) return;
  absl::StatusOr<wire::PreallocationRouteHeader> header =
      wire::ParsePreallocationRouteHeader(m.frames);
  if (!header.ok()) return;
  const uint64_t room = header->room;
  const std::optional<session::DecodeRoomView> view = rooms->Find(room);
  if (!view) return;
  auto node = nodes.find(view->bootstrap_address);
  if (node == nodes.end() || !node->second->kvrail) return;  // a CachePD peer drops offers
  const std::optional<int> rank = rooms->RankAt(room, m.endpoint);
  std::shared_ptr<const layout::Manifest> manifest = rooms->ManifestOf(room);
  if (!rank || manifest == nullptr) return;
  // A pre-allocation sent again keeps the slot offered first.
  if (auto offered = offered_slots.find(room);
      offered != offered_slots.end() && offered->second.count(static_cast<uint32_t>(*rank)) != 0) {
    return;
  }
  absl::StatusOr<std::shared_ptr<const plan::CopyPlan>> landing =
      LandingPlanOf(*node->second, static_cast<uint32_t>(*rank));
  const auto route = std::make_pair(view->bootstrap_address, *rank);
  if (!landing.ok() || !RouteStagesRowsLocked(**landing)) {
    if (row_staging_logged.insert(route).second) {
      spdlog::info("event=row_staging bootstrap={} prefill_rank={} staged=no why=\"{}\"",
                   route.first, route.second,
                   landing.ok() ? "its rows land back to back, are long, or the transport "
                                  "writes them whole"
                                : DescribeError(landing.status()));
    }
    return;
  }
  absl::StatusOr<uint64_t> bytes = plan::LandingBytes(*landing, *manifest);
  if (!bytes.ok() || *bytes == 0) return;
  const std::optional<uint64_t> offset = row_slots->Take(*bytes);
  if (!offset) {
    ++stats.row_staging_full;
    return;  // no slot free: the rank writes the pages, row by row
  }
  absl::StatusOr<std::vector<std::string>> offer = wire::BuildStagingOffer(
      {room, session_id, reinterpret_cast<uintptr_t>(row_staging_memory->base) + *offset, *bytes});
  if (!offer.ok()) {
    row_slots->Give(*offset);
    return;
  }
  if (row_staging_logged.insert(route).second) {
    spdlog::info("event=row_staging bootstrap={} prefill_rank={} staged=yes bytes={}", route.first,
                 route.second, *bytes);
  }
  offered_slots[room][static_cast<uint32_t>(*rank)] = OfferedSlot{*offset, *bytes};
  // Proven as the pre-allocation after it is (control/wire/proof.h), and on the same route, so
  // that it is there when the pre-allocation starts the room's transfer.
  absl::StatusOr<std::vector<std::string>> proof =
      wire::BuildOwnerProof({room, session_id, session_key->bytes()});
  if (proof.ok()) (void)outbox->Send(m.endpoint, *proof);
  (void)outbox->Send(m.endpoint, *offer);
}

void DecodeSidecar::KeepStagingAnswerLocked(const std::vector<std::string>& message,
                                            const std::string& host) {
  absl::StatusOr<wire::StagingAnswer> answer = wire::ParseStagingAnswer(message);
  if (!answer.ok()) {
    RefuseLocked(host, "staging answer dropped: " + DescribeError(answer.status()));
    return;
  }
  auto room = offered_slots.find(answer->room);
  if (room == offered_slots.end()) return;  // the room ended: its slots went with it
  auto slot = room->second.find(answer->prefill_rank);
  if (slot == room->second.end()) return;
  if (answer->staged) {
    slot->second.staged = true;
    return;
  }
  // Written in place: the rank never wrote the slot.
  row_slots->Give(slot->second.offset);
  room->second.erase(slot);
  if (room->second.empty()) offered_slots.erase(room);
}

bool DecodeSidecar::TakeForRowStagingLocked(const std::vector<std::string>& message) {
  const std::optional<LiveSuccess> success = LiveSuccessLocked(message);
  if (!success) return false;
  auto room = offered_slots.find(success->room);
  if (room == offered_slots.end()) return false;
  auto found = room->second.find(success->rank);
  if (found == room->second.end()) return false;
  OfferedSlot& slot = found->second;
  // The same Success again while its rows are scattered: dropped, so that it cannot count before
  // they are in the pages (once they are, the ledger has the rank's Success).
  if (slot.scattering) return true;
  if (!slot.staged) {
    // Its rows may be in the slot, or in the pages: a Success counted now could be wrong KV.
    ApplyLocked(rooms->Fail(
        success->room,
        absl::StrFormat("row staging: prefill rank %d sent Success without answering the "
                        "staging offered for its rows (a slot of %d bytes)",
                        success->rank, slot.bytes),
        RoomNow(), session::FailureCause::kPeerFailed));
    return true;
  }
  std::shared_ptr<const layout::Manifest> manifest;
  std::shared_ptr<PrefillNode> node;
  if (!LandingInputsLocked(*success, "row staging", "cannot be scattered into the pages", manifest,
                           node)) {
    return true;
  }
  slot.scattering = true;
  rooms->BeginStaging(success->room);  // its pages are held until the scatter returned
  // Read here, on the owner: the strand touches no member the owner writes.
  const uint8_t* rows = static_cast<const uint8_t*>(row_staging_memory->base) + slot.offset;
  strands.Post(absl::StrCat("scatter ", success->room),
               [this, message, room = success->room, rank = success->rank, slot, rows,
                manifest = std::move(manifest), node = std::move(node)]() mutable {
                 ScatterStagedRows(std::move(message), room, rank, slot, rows, std::move(manifest),
                                   std::move(node));
               });
  return true;
}

void DecodeSidecar::ScatterStagedRows(std::vector<std::string> success, uint64_t room,
                                      uint32_t rank, OfferedSlot slot, const uint8_t* rows,
                                      std::shared_ptr<const layout::Manifest> manifest,
                                      std::shared_ptr<PrefillNode> node) {
  const absl::Status scattered = [&]() -> absl::Status {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<const plan::CopyPlan> landing,
                            LandingPlanOf(*node, rank));
    plan::CopyList copies;
    KVRAIL_RETURN_IF_ERROR(plan::LandingCopies(*landing, *manifest, copies, /*strided=*/true));
    uint64_t total = 0;
    for (const Copy& c : copies) {
      total += PayloadBytes(c);
      // Bounds before bytes: every row inside the arena (the plan checked the manifest's pages).
      if (c.dst_offset > arena_bytes || DestinationSpan(c) > arena_bytes - c.dst_offset) {
        return absl::InternalError(
            absl::StrFormat("a copy of %d rows lands at %d, past the arena's %d bytes", c.rows,
                            c.dst_offset, arena_bytes));
      }
    }
    if (total != slot.bytes) {
      return absl::InternalError(absl::StrFormat(
          "the room's rows from the rank are %d bytes, its slot %d", total, slot.bytes));
    }
    // The slot holds the rows back to back; in the pages a copy's rows land apart (the other
    // ranks' heads between them), stored as --landing-stores says: auto streams them past the
    // cache, as the UCX lanes land such rows (engine/transport/landing_copy.h, decision 0018).
    const auto* from = reinterpret_cast<const std::byte*>(rows);
    auto* const pages = reinterpret_cast<std::byte*>(arena_base);
    for (const Copy& c : copies) {
      transport::LandingCopyRows(pages + c.dst_offset, c.dst_stride, from, c.length, c.length,
                                 c.rows, options.landing_stores);
      from += PayloadBytes(c);
    }
    transport::LandingFence();  // before the Success that says the rows are in the pages
    return absl::OkStatus();
  }();
  Owned([&] {
    if (!rooms) return;                           // the arena went away meanwhile
    if (row_slots) row_slots->Give(slot.offset);  // the rows left it, or never will now
    if (auto r = offered_slots.find(room); r != offered_slots.end()) {
      r->second.erase(rank);
      if (r->second.empty()) offered_slots.erase(r);
    }
    if (scattered.ok()) {
      ++stats.rows_scattered;
      ContinueSuccessLocked(success, /*host=*/"");  // proven already
    } else {
      ApplyLocked(rooms->Fail(
          room,
          absl::StrFormat("row staging: scattering what prefill rank %d staged into the pages "
                          "failed: %s",
                          rank, DescribeError(scattered)),
          RoomNow(), session::FailureCause::kEngine));
    }
    // The scatter has returned: the room's pages may be released now (if its fence answers came).
    ApplyLocked(rooms->EndStaging(room, RoomNow()));
  });
}

void DecodeSidecar::ContinueSuccessLocked(const std::vector<std::string>& message,
                                          const std::string& host) {
  if (options.verify_digest && TakeForDigestLocked(message)) return;
  DeliverSuccessLocked(message, host);
}

void DecodeSidecar::ReturnRoomSlotsLocked(uint64_t room, bool proven) {
  auto found = offered_slots.find(room);
  if (found == offered_slots.end()) return;
  for (auto it = found->second.begin(); it != found->second.end();) {
    if (it->second.scattering) {  // its scatter gives it back
      ++it;
      continue;
    }
    if (proven) {
      row_slots->Give(it->second.offset);
    } else {
      ++stats.row_staging_quarantined;
      spdlog::warn(
          "decode: room {}: the row staging slot of prefill rank {} ({} bytes) is kept out of "
          "use: the room's fence did not prove that no write of it lands any more",
          room, it->first, it->second.bytes);
    }
    it = found->second.erase(it);
  }
  if (found->second.empty()) offered_slots.erase(found);
}

}  // namespace kvrail::sidecar
