// Per-lane queues of transport calls decided under a caller's lock and made outside it: what
// lets the lanes of one peer post (over shared memory: copy) on several cores at once while
// each lane's calls reach the transport in the order they were decided (a flush never overtakes
// the batches it covers). Used by the transfer scheduler and by `kvrail bench raw`'s window.
#ifndef KVRAIL_ENGINE_TRANSFER_LANE_CALLS_H_
#define KVRAIL_ENGINE_TRANSFER_LANE_CALLS_H_

#include <cstddef>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace kvrail::transfer {

// One lane's calls, guarded by the caller's lock.
template <typename Call>
struct LaneCalls {
  std::vector<Call> queued;  // decided and counted, not yet made, in order
  bool sending = false;      // a thread is making this lane's calls; it takes what is queued
  int live = 0;              // calls made whose completion has not run (the caller decrements)
  // The sending thread's own (only it touches them, with or without the lock), kept from round
  // to round so that making calls allocates nothing once the lane has warmed up: a post over
  // shared memory is a copy of a few microseconds, and every malloc shows.
  std::vector<Call> taken;
  std::vector<absl::Status> results;
};

// Makes the queued calls of lane `self` (the lane whose completion this thread runs; -1 for
// none) and of every lane with nothing at the transport (no completion is due to send them),
// with `lock` released while the calls are made, one lane at a time, in order. `hooks`:
//   bool Keep(const Call&)                       lock held; false drops the call (Undo)
//   void Undo(int lane, const Call&)             lock held; takes back what queuing counted
//   void Taking(const Call&), Taken(Call&)       lock held, around the unlocked stretch; Taken
//                                                comes after Failed and may take what the
//                                                call holds
//   absl::Status Issue(int lane, const Call&)    lock released; the transport call
//   void Failed(int lane, Call&, absl::Status)   lock held, after Undo, for a refused call
template <typename Call, typename Hooks>
void SendLaneCalls(std::unique_lock<std::mutex>& lock, std::vector<LaneCalls<Call>>& lanes,
                   int self, Hooks& hooks) {
  for (bool sent = true; sent;) {
    sent = false;
    for (size_t lane = 0; lane < lanes.size(); ++lane) {
      LaneCalls<Call>& lc = lanes[lane];
      const int index = static_cast<int>(lane);
      if (lc.sending || lc.queued.empty() || (index != self && lc.live > 0)) continue;
      lc.sending = true;
      while (!lc.queued.empty()) {
        std::vector<Call>& calls = lc.taken;
        calls.swap(lc.queued);  // lc.queued takes the emptied buffer of the last round
        size_t kept = 0;        // the calls to make move to the front, in order
        for (size_t i = 0; i < calls.size(); ++i) {
          if (!hooks.Keep(calls[i])) {
            hooks.Undo(index, calls[i]);
            continue;
          }
          hooks.Taking(calls[i]);
          ++lc.live;
          if (kept != i) calls[kept] = std::move(calls[i]);
          ++kept;
        }
        calls.resize(kept);
        lock.unlock();
        lc.results.resize(calls.size());
        for (size_t i = 0; i < calls.size(); ++i) lc.results[i] = hooks.Issue(index, calls[i]);
        lock.lock();
        for (size_t i = 0; i < calls.size(); ++i) {
          if (lc.results[i].ok()) continue;
          --lc.live;
          hooks.Undo(index, calls[i]);
          hooks.Failed(index, calls[i], std::move(lc.results[i]));
        }
        for (Call& call : calls) hooks.Taken(call);
        calls.clear();
        lc.results.clear();
      }
      lc.sending = false;
      sent = true;
    }
  }
}

}  // namespace kvrail::transfer

#endif  // KVRAIL_ENGINE_TRANSFER_LANE_CALLS_H_
