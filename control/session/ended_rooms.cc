#include "control/session/ended_rooms.h"

#include <set>
#include <string>
#include <utility>

#include "control/session/ended_room.h"

namespace kvrail::session {

bool EndedRooms::Remember(const RoomEvent& event, absl::Time now, absl::Time keep_until,
                          std::set<std::string> unproven_sessions) {
  if (rooms_.contains(event.room)) return false;
  Entry entry;
  entry.room.state = event.state;
  entry.room.reason = event.reason;
  entry.room.cause = event.cause;
  entry.room.bootstrap_token = event.bootstrap_token;
  if (event.spec_candidate_ids) entry.room.speculative_ids = *event.spec_candidate_ids;
  entry.room.cached_tokens = event.cached_tokens;
  entry.room.first_token_logprob = event.bootstrap_logprob;
  entry.room.unproven_sessions = std::move(unproven_sessions);
  entry.keep_until = keep_until;
  entry.sequence = next_sequence_++;
  if (entry.room.state == TransferPoll::kFailed) ++failed_;
  order_.emplace_back(event.room, entry.sequence);
  rooms_.emplace(event.room, std::move(entry));
  Expire(now);
  return true;
}

const EndedRoom* EndedRooms::Find(uint64_t room) const {
  auto found = rooms_.find(room);
  return found == rooms_.end() ? nullptr : &found->second.room;
}

absl::Status EndedRooms::Refusal(uint64_t room) const {
  const EndedRoom* ended = Find(room);
  if (ended == nullptr) return absl::OkStatus();
  return EndedRoomError(room, ended->state, ended->reason);
}

void EndedRooms::Forget(uint64_t room) {
  auto found = rooms_.find(room);
  if (found != rooms_.end()) Erase(found);
}

void EndedRooms::Expire(absl::Time now) {
  // The oldest first: past the count bound, and past its own time. A young room at the front
  // keeps the ones behind it a while longer (each is forgotten once it reaches the front).
  while (!order_.empty()) {
    const auto [room, sequence] = order_.front();
    auto found = rooms_.find(room);
    if (found == rooms_.end() || found->second.sequence != sequence) {
      order_.pop_front();  // forgotten already
      continue;
    }
    if (rooms_.size() <= capacity_ || found->second.keep_until > now) return;
    Erase(found);
    order_.pop_front();
  }
}

void EndedRooms::Erase(absl::flat_hash_map<uint64_t, Entry>::iterator it) {
  if (it->second.room.state == TransferPoll::kFailed) --failed_;
  rooms_.erase(it);
}

}  // namespace kvrail::session
