// At most one log line per peer address per interval, for what a peer can make a server say
// as often as it likes (refused requests, closed connections: docs/SECURITY.md). The lines held
// back are counted, and the count goes out with the peer's next line, or from TakeHeldBack once
// the interval has passed. Thread-safe.
#ifndef KVRAIL_CONTROL_SESSION_PEER_LOG_LIMITER_H_
#define KVRAIL_CONTROL_SESSION_PEER_LOG_LIMITER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kvrail::session {

class PeerLogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // Peers tracked at most: past that, peers whose interval has passed are forgotten, and
  // while none has, new peers share the one entry kOtherPeers, so memory stays bounded
  // however many addresses a flood comes from.
  static constexpr size_t kMaxPeers = 4096;
  static constexpr const char* kOtherPeers = "other";

  explicit PeerLogLimiter(Clock::duration interval) : interval_(interval) {}

  struct Verdict {
    bool log = false;        // write this line
    uint64_t held_back = 0;  // when logging: lines about this peer held back since its last
  };

  // Whether a line about `peer` may be written at `now`.
  Verdict Admit(const std::string& peer, Clock::time_point now);

  // Every peer with lines held back whose interval has passed by `now`, with the count; those
  // counts are then reset. For a periodic "held back" line per peer.
  std::vector<std::pair<std::string, uint64_t>> TakeHeldBack(Clock::time_point now);

 private:
  struct Entry {
    Clock::time_point last_logged;
    uint64_t held_back = 0;
  };

  const Clock::duration interval_;
  std::mutex mu_;
  std::map<std::string, Entry> peers_;  // guarded by mu_
};

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_PEER_LOG_LIMITER_H_
