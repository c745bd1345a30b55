#include "control/sidecar/staging_offers.h"

#include <algorithm>

namespace kvrail::sidecar {

void StagingOffers::Keep(wire::StagingOffer offer) {
  Key key{offer.session_id, offer.room};
  const uint64_t sequence = next_sequence_++;
  offers_.insert_or_assign(key, Kept{std::move(offer), sequence});
  order_.emplace_back(std::move(key), sequence);
  // Stale entries at the front go; the oldest live offers go while there are too many.
  while (!order_.empty()) {
    const auto& [oldest, kept_at] = order_.front();
    auto found = offers_.find(oldest);
    const bool live = found != offers_.end() && found->second.sequence == kept_at;
    if (live && offers_.size() <= bound_) break;
    if (live) offers_.erase(found);
    order_.pop_front();
  }
  // Stale entries behind a live one that stays: rebuilt from the live offers, oldest first.
  if (order_.size() > 2 * bound_ + 16) {
    order_.clear();
    for (const auto& [k, kept] : offers_) order_.emplace_back(k, kept.sequence);
    std::sort(order_.begin(), order_.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
  }
}

std::optional<wire::StagingOffer> StagingOffers::Take(const std::string& session, uint64_t room) {
  auto found = offers_.extract(Key{session, room});
  if (found.empty()) return std::nullopt;
  return std::move(found.mapped().offer);
}

void StagingOffers::ForgetSession(const std::string& session) {
  for (auto it = offers_.lower_bound(Key{session, 0});
       it != offers_.end() && it->first.first == session;) {
    it = offers_.erase(it);
  }
}

}  // namespace kvrail::sidecar
