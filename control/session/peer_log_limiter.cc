#include "control/session/peer_log_limiter.h"

namespace kvrail::session {

PeerLogLimiter::Verdict PeerLogLimiter::Admit(const std::string& peer, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    if (peers_.size() >= kMaxPeers) {
      for (auto p = peers_.begin(); p != peers_.end();) {
        p = p->second.held_back == 0 && now - p->second.last_logged >= interval_ ? peers_.erase(p)
                                                                                 : std::next(p);
      }
    }
    if (peers_.size() >= kMaxPeers) {
      it = peers_.find(kOtherPeers);
      if (it == peers_.end()) it = peers_.emplace(kOtherPeers, Entry{now, 0}).first;
      ++it->second.held_back;
      return {};
    }
    peers_.emplace(peer, Entry{now, 0});
    return {true, 0};
  }
  Entry& entry = it->second;
  if (now - entry.last_logged < interval_) {
    ++entry.held_back;
    return {};
  }
  Verdict verdict{true, entry.held_back};
  entry.last_logged = now;
  entry.held_back = 0;
  return verdict;
}

std::vector<std::pair<std::string, uint64_t>> PeerLogLimiter::TakeHeldBack(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (auto& [peer, entry] : peers_) {
    if (entry.held_back == 0 || now - entry.last_logged < interval_) continue;
    out.emplace_back(peer, entry.held_back);
    entry.held_back = 0;
    entry.last_logged = now;
  }
  return out;
}

}  // namespace kvrail::session
