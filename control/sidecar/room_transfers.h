// The data-plane transfers of the prefill rooms in flight on one sidecar: their one owner and
// their lifecycle (docs/ARCHITECTURE.md, "Failed means fenced"):
//
//   preparing --(every destination prepared)--> posting --(every transfer landed)--> landed
//       |                                          |
//       +--(abort, a failed destination)-----------+--> failing --(every transfer fenced)--> fenced
//
// A room's transfers are its writes to each decode destination (one scheduler transfer each),
// for each of its works: one in the default mode; with layer-wise streaming (CACHEPD §6.11) one
// per LayersReady that made new layers final, then the final one (its Ready's). A room ends
// (landed or fenced) only when no transfer of it can write any more: nothing was submitted, or
// every submitted transfer has reported its outcome (the scheduler reports a failure only once
// fenced); it lands only once its final work and every earlier one have landed. A generation
// per preparation makes late work harmless: a preparation that finishes after its room failed
// submits nothing.
//
// Not thread-safe, and never calls out: the sidecar's owner thread alone uses it, and what each
// call returns (submit, cancel) runs once the owner's job is done, off that thread.
#ifndef KVRAIL_CONTROL_SIDECAR_ROOM_TRANSFERS_H_
#define KVRAIL_CONTROL_SIDECAR_ROOM_TRANSFERS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "control/session/failure_cause.h"

namespace kvrail::sidecar {

enum class TransferPhase { kPreparing, kPosting, kFailing };

// What the caller must do after a call, outside the lock.
struct TransferActions {
  uint64_t room = 0;  // the room they concern
  // Transfer ids to cancel in the scheduler (their outcomes follow, once fenced).
  std::vector<uint64_t> cancel;
  // Set when the room just ended: it leaves this table.
  struct Ended {
    bool landed = false;  // every byte of every destination landed
    std::string reason;   // !landed: the first failure
    std::string blame;    // !landed: the session whose transport failure it was, or empty
    session::FailureCause cause = session::FailureCause::kNone;  // !landed: the first failure's
    uint64_t bytes = 0;
    uint64_t copies = 0;
    std::map<std::string, uint64_t> copies_by_session;  // the copies posted to each session
    absl::Duration elapsed;                             // from Begin
    // !landed: every transfer's fence proved that nothing of it lands any more
    // (transfer::RoomOutcome::fence_proven).
    bool fence_proven = true;
  };
  std::optional<Ended> ended;
};

class RoomTransfers {
 public:
  // One work of a room starts being prepared (descriptor fetch, connect, copy expansion):
  // `bytes` of it, `final` when it is the room's last. Returns the preparation's generation. A
  // room already tracked gains the work (layer-wise streaming).
  uint64_t Begin(uint64_t room, uint64_t bytes, bool final, absl::Time now);

  // The preparation of `generation` is done, with one transfer per destination, in `sessions`
  // order. Returns the transfer ids to submit (kPosting), or nullopt: the room failed meanwhile
  // and nothing was submitted (it ended now, `actions.ended`, unless transfers of its other
  // works are still in flight), there was nothing to move (it ended now if that was all that
  // was left), or the generation is stale (nothing to do).
  std::optional<std::vector<uint64_t>> Prepared(uint64_t room, uint64_t generation,
                                                const std::vector<std::string>& sessions,
                                                absl::Time now, TransferActions& actions);

  // After the ids from Prepared were submitted, if the room failed while they were being
  // submitted (its FailingFlag was set once every Submit returned): the ones to cancel. A room
  // whose flag was still clear then needs no call: a later Fail cancels them itself.
  TransferActions Submitted(uint64_t room);

  // The room fails (an abort, a failed preparation or submission). `blame` names the session
  // at fault, empty when nobody is. Its first reason stays. Ends it at once when nothing of it
  // is in flight; otherwise cancels what is.
  // `cause`: the failure's (session::FailureCause).
  TransferActions Fail(uint64_t room, std::string reason, std::string blame, absl::Time now,
                       session::FailureCause cause = session::FailureCause::kAborted);

  // A submitted transfer's outcome (fenced when it failed). A failure fails the room; the room
  // ends with the last outcome. `blame` is the session to blame if the failure is the
  // transport's (the caller decides: not for a cancel).
  // `copies`: the copies it posted (RoomStats::copies), added to the room's.
  TransferActions Outcome(uint64_t transfer_id, const absl::Status& status,
                          const std::string& blame, absl::Time now, bool fence_proven = true,
                          uint64_t copies = 0);

  // The session of a transfer in flight, or empty.
  std::string SessionOf(uint64_t transfer_id) const;
  std::optional<TransferPhase> Phase(uint64_t room) const;
  // A flag that turns true once `room` fails (kFailing), for a strand preparing its work to read
  // without asking the owner (a preparation of a failed room is moot); null for a room not
  // tracked. The one thing of this table another thread reads.
  std::shared_ptr<const std::atomic<bool>> FailingFlag(uint64_t room) const;
  bool Tracks(uint64_t room) const { return rooms_.count(room) > 0; }
  size_t size() const { return rooms_.size(); }
  size_t transfers_in_flight() const { return owners_.size(); }

 private:
  struct Room {
    std::set<uint64_t> preparing;  // generations of works being prepared
    bool final = false;            // the last work has begun
    TransferPhase phase = TransferPhase::kPreparing;
    std::vector<uint64_t> ids;  // submitted (or being submitted), not yet reported
    std::string reason;         // kFailing: the first failure
    session::FailureCause cause = session::FailureCause::kNone;
    std::string blame;
    uint64_t bytes = 0;
    uint64_t copies = 0;
    std::map<std::string, uint64_t> copies_by_session;
    absl::Time started;
    bool fence_proven = true;
    // Set with phase = kFailing (FailingFlag).
    std::shared_ptr<std::atomic<bool>> failing = std::make_shared<std::atomic<bool>>(false);
  };
  struct Owner {
    uint64_t room = 0;
    std::string session;
  };

  void EndLocked(uint64_t room_id, Room& room, absl::Time now, TransferActions& actions);
  // Ends the room when nothing of it can write any more and nothing is left to send: failing
  // with no transfer in flight, or every work begun, prepared and landed.
  void EndIfDone(uint64_t room_id, Room& room, absl::Time now, TransferActions& actions);

  std::map<uint64_t, Room> rooms_;
  std::map<uint64_t, Owner> owners_;  // transfer id -> room and destination session
  uint64_t next_generation_ = 1;
  uint64_t next_transfer_id_ = 1;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_ROOM_TRANSFERS_H_
