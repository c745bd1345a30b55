#include "control/sidecar/room_transfers.h"

#include <algorithm>
#include <utility>

namespace kvrail::sidecar {

uint64_t RoomTransfers::Begin(uint64_t room_id, uint64_t bytes, bool final, absl::Time now) {
  auto [found, fresh] = rooms_.try_emplace(room_id);
  Room& room = found->second;
  if (fresh) room.started = now;
  const uint64_t generation = next_generation_++;
  room.preparing.insert(generation);
  room.final = room.final || final;
  room.bytes += bytes;
  return generation;
}

std::optional<std::vector<uint64_t>> RoomTransfers::Prepared(
    uint64_t room_id, uint64_t generation, const std::vector<std::string>& sessions, absl::Time now,
    TransferActions& actions) {
  actions.room = room_id;
  auto found = rooms_.find(room_id);
  if (found == rooms_.end() || found->second.preparing.erase(generation) == 0) return std::nullopt;
  Room& room = found->second;
  if (room.phase == TransferPhase::kFailing || sessions.empty()) {
    // Failed while it was prepared (nothing of this work was submitted), or nothing to move.
    EndIfDone(room_id, room, now, actions);
    return std::nullopt;
  }
  room.phase = TransferPhase::kPosting;
  std::vector<uint64_t> ids;
  for (const std::string& session : sessions) {
    const uint64_t id = next_transfer_id_++;
    ids.push_back(id);
    room.ids.push_back(id);
    owners_[id] = Owner{room_id, session};
  }
  return ids;
}

TransferActions RoomTransfers::Submitted(uint64_t room_id) {
  TransferActions actions;
  actions.room = room_id;
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return actions;
  if (found->second.phase == TransferPhase::kFailing) actions.cancel = found->second.ids;
  return actions;
}

TransferActions RoomTransfers::Fail(uint64_t room_id, std::string reason, std::string blame,
                                    absl::Time now, session::FailureCause cause) {
  TransferActions actions;
  actions.room = room_id;
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return actions;
  Room& room = found->second;
  if (room.phase != TransferPhase::kFailing) {
    room.phase = TransferPhase::kFailing;
    room.failing->store(true);
    room.reason = std::move(reason);
    room.cause = cause;
    room.blame = std::move(blame);
  }
  if (room.ids.empty()) {
    EndLocked(room_id, room, now, actions);  // what is being prepared will submit nothing
    return actions;
  }
  actions.cancel = room.ids;
  return actions;
}

TransferActions RoomTransfers::Outcome(uint64_t transfer_id, const absl::Status& status,
                                       const std::string& blame, absl::Time now, bool fence_proven,
                                       uint64_t copies) {
  TransferActions actions;
  auto owner = owners_.find(transfer_id);
  if (owner == owners_.end()) return actions;
  const uint64_t room_id = owner->second.room;
  const std::string session = std::move(owner->second.session);
  actions.room = room_id;
  owners_.erase(owner);
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return actions;
  Room& room = found->second;
  room.ids.erase(std::remove(room.ids.begin(), room.ids.end(), transfer_id), room.ids.end());
  room.fence_proven = room.fence_proven && fence_proven;
  room.copies += copies;
  room.copies_by_session[session] += copies;
  if (!status.ok() && room.phase != TransferPhase::kFailing) {
    room.phase = TransferPhase::kFailing;
    room.failing->store(true);
    room.reason = status.ToString();
    room.cause = session::FailureCauseOf(status);
    room.blame = blame;
    actions.cancel = room.ids;  // the siblings stop too
  }
  EndIfDone(room_id, room, now, actions);
  return actions;
}

void RoomTransfers::EndIfDone(uint64_t room_id, Room& room, absl::Time now,
                              TransferActions& actions) {
  if (!room.ids.empty()) return;
  if (room.phase == TransferPhase::kFailing || (room.final && room.preparing.empty())) {
    EndLocked(room_id, room, now, actions);
  }
}

void RoomTransfers::EndLocked(uint64_t room_id, Room& room, absl::Time now,
                              TransferActions& actions) {
  TransferActions::Ended ended;
  ended.landed = room.phase != TransferPhase::kFailing;
  ended.reason = std::move(room.reason);
  ended.blame = std::move(room.blame);
  ended.cause = room.cause;
  ended.bytes = room.bytes;
  ended.copies = room.copies;
  ended.copies_by_session = std::move(room.copies_by_session);
  ended.fence_proven = room.fence_proven;
  ended.elapsed = now - room.started;
  actions.ended = std::move(ended);
  for (uint64_t id : room.ids) owners_.erase(id);
  rooms_.erase(room_id);
}

std::string RoomTransfers::SessionOf(uint64_t transfer_id) const {
  auto found = owners_.find(transfer_id);
  return found == owners_.end() ? std::string() : found->second.session;
}

std::optional<TransferPhase> RoomTransfers::Phase(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return std::nullopt;
  return found->second.phase;
}

std::shared_ptr<const std::atomic<bool>> RoomTransfers::FailingFlag(uint64_t room_id) const {
  auto found = rooms_.find(room_id);
  if (found == rooms_.end()) return nullptr;
  return found->second.failing;
}

}  // namespace kvrail::sidecar
