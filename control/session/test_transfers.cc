#include "control/session/test_transfers.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvrail::session::testing {
namespace {

absl::Status StatusOf(FailureCause cause, absl::string_view reason) {
  switch (cause) {
    case FailureCause::kTimeout:
      return absl::DeadlineExceededError(reason);
    case FailureCause::kBounds:
      return absl::OutOfRangeError(reason);
    case FailureCause::kInvalid:
      return absl::InvalidArgumentError(reason);
    case FailureCause::kRefused:
      return absl::PermissionDeniedError(reason);
    case FailureCause::kAborted:
      return absl::CancelledError(reason);
    default:
      return absl::UnavailableError(reason);
  }
}

}  // namespace

void Append(PrefillOutput& into, PrefillOutput from) {
  for (auto& m : from.messages) into.messages.push_back(std::move(m));
  for (auto& t : from.transfers) into.transfers.push_back(std::move(t));
  into.cancels.insert(into.cancels.end(), from.cancels.begin(), from.cancels.end());
  into.fences.insert(into.fences.end(), from.fences.begin(), from.fences.end());
  for (auto& r : from.replaced) into.replaced.push_back(std::move(r));
  for (auto& e : from.events) into.events.push_back(std::move(e));
  if (into.rejected.ok()) into.rejected = from.rejected;
}

std::vector<uint64_t> Post(PrefillRooms& rooms, const TransferWork& work, absl::Time now,
                           PrefillOutput& out) {
  std::vector<std::string> sessions;
  for (const TransferDestination& d : work.destinations) {
    if (d.peer->dummy || d.peer->copy_plan == nullptr) continue;
    sessions.push_back(d.peer->registration.session_id);
  }
  return rooms.TransfersPrepared(work.room, work.generation, sessions, now, out);
}

absl::StatusOr<PrefillOutput> LandAll(PrefillRooms& rooms, uint64_t room, absl::Time now,
                                      const std::map<std::string, uint64_t>& copies_by_session) {
  std::optional<PrefillRoomView> view = rooms.Find(room);
  if (!view.has_value() || !view->transfer.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("room ", room, " has no transfers"));
  }
  PrefillOutput out;
  for (uint64_t generation : view->preparing) {
    (void)rooms.TransfersPrepared(room, generation, {}, now, out);
  }
  for (uint64_t id : view->transfer_ids) {
    const std::string session = rooms.SessionOfTransfer(id);
    auto copies = copies_by_session.find(session);
    Append(out, rooms.TransferOutcome(id, absl::OkStatus(), "", now, true,
                                      copies == copies_by_session.end() ? 0 : copies->second));
  }
  return out;
}

PrefillOutput FailAll(PrefillRooms& rooms, uint64_t room, absl::string_view failed_session,
                      absl::string_view reason, absl::Time now, bool fence_proven,
                      FailureCause cause) {
  PrefillOutput out;
  std::optional<PrefillRoomView> view = rooms.Find(room);
  if (!view.has_value() || !view->transfer.has_value()) return out;
  if (view->transfer_ids.empty()) {
    if (!view->preparing.empty()) {
      Append(out, rooms.PreparationFailed(room, view->preparing.front(), reason, failed_session,
                                          cause, now));
    }
    return out;
  }
  bool first = true;
  for (uint64_t id : view->transfer_ids) {
    Append(out, rooms.TransferOutcome(
                    id, first ? StatusOf(cause, reason) : absl::CancelledError("its room failed"),
                    first ? failed_session : "", now, fence_proven));
    first = false;
  }
  return out;
}

}  // namespace kvrail::session::testing
