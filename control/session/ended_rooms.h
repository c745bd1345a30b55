// What a room ledger (PrefillRooms, DecodeRooms) remembers of its rooms that ended: each room's
// one terminal event (docs/ENGINE-API.md, "Exactly one terminal event"), for the engine's Poll,
// for the refusal of a later engine call about the room (EndedRoomError), and, on a prefill, to
// answer a late pre-allocation or fence request of the room (CACHEPD §11.2). A ledger remembers
// a room here when its terminal event goes out, and never makes a second one for a room
// remembered here.
//
// Bounded: the newest `capacity` rooms are kept, and each room at least until the time it was
// remembered with (a prefill's failed rooms: failed_room_ttl). Pure: the caller gives the time.
#ifndef KVRAIL_CONTROL_SESSION_ENDED_ROOMS_H_
#define KVRAIL_CONTROL_SESSION_ENDED_ROOMS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "control/session/failure_cause.h"
#include "control/session/room_output.h"
#include "control/session/transfer_poll.h"

namespace kvrail::session {

// A room's end, as its terminal event said it (RoomEvent).
struct EndedRoom {
  TransferPoll state = TransferPoll::kFailed;  // kSuccess or kFailed
  std::string reason;                          // kFailed
  FailureCause cause = FailureCause::kNone;    // kFailed
  // Decode kSuccess (RoomEvent): the token, speculative ids, cached tokens and logprob.
  int64_t bootstrap_token = -1;
  std::vector<int32_t> speculative_ids;
  int64_t cached_tokens = 0;
  std::optional<double> first_token_logprob;
  // Prefill: the destination sessions for which its fence could not prove that no write of it
  // lands any more (a late fence request of the room from one of them is answered so).
  std::set<std::string> unproven_sessions;
};

class EndedRooms {
 public:
  explicit EndedRooms(size_t capacity = 65536) : capacity_(capacity) {}

  // Remembers the terminal `event` of its room until at least `keep_until`, forgetting what is
  // past both bounds at `now`. False, changing nothing, when the room is remembered already (its
  // terminal event went out before: the ledger must not make another).
  bool Remember(const RoomEvent& event, absl::Time now, absl::Time keep_until,
                std::set<std::string> unproven_sessions = {});
  // The room's end, while it is remembered; null otherwise.
  const EndedRoom* Find(uint64_t room) const;
  // OK for a room not remembered; otherwise the refusal of an engine call about it
  // (EndedRoomError: "room N already failed: <reason>").
  absl::Status Refusal(uint64_t room) const;
  // A room id used again (a decode's new room): its old end is forgotten.
  void Forget(uint64_t room);
  // Forgets what is past both bounds at `now`.
  void Expire(absl::Time now);

  size_t size() const { return rooms_.size(); }
  size_t failed() const { return failed_; }

 private:
  struct Entry {
    EndedRoom room;
    absl::Time keep_until;
    uint64_t sequence = 0;  // which of order_'s entries is this one's
  };
  void Erase(absl::flat_hash_map<uint64_t, Entry>::iterator it);

  size_t capacity_;
  absl::flat_hash_map<uint64_t, Entry> rooms_;
  // Oldest first: (room, sequence); an entry whose sequence is not its room's current one was
  // forgotten (Forget) and is skipped.
  std::deque<std::pair<uint64_t, uint64_t>> order_;
  uint64_t next_sequence_ = 1;
  size_t failed_ = 0;
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_ENDED_ROOMS_H_
