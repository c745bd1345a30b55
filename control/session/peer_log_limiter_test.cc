#include "control/session/peer_log_limiter.h"

#include <gtest/gtest.h>

#include <string>

namespace kvrail::session {
namespace {

using Clock = PeerLogLimiter::Clock;
using std::chrono::seconds;

TEST(PeerLogLimiterTest, OneLinePerPeerPerIntervalWithTheCountHeldBack) {
  PeerLogLimiter limiter(seconds(10));
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(limiter.Admit("10.0.0.1", t0).log);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Admit("10.0.0.1", t0 + seconds(i)).log);
  EXPECT_TRUE(limiter.Admit("10.0.0.2", t0 + seconds(1)).log);  // another peer is its own
  PeerLogLimiter::Verdict later = limiter.Admit("10.0.0.1", t0 + seconds(10));
  EXPECT_TRUE(later.log);
  EXPECT_EQ(later.held_back, 5u);
  EXPECT_EQ(limiter.Admit("10.0.0.1", t0 + seconds(20)).held_back, 0u);
}

TEST(PeerLogLimiterTest, HeldBackCountsAreTakenOnceTheIntervalPasses) {
  PeerLogLimiter limiter(seconds(10));
  const Clock::time_point t0 = Clock::now();
  limiter.Admit("a", t0);
  limiter.Admit("a", t0 + seconds(1));
  limiter.Admit("a", t0 + seconds(2));
  limiter.Admit("b", t0);
  EXPECT_TRUE(limiter.TakeHeldBack(t0 + seconds(5)).empty());
  auto held = limiter.TakeHeldBack(t0 + seconds(10));
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0], (std::pair<std::string, uint64_t>{"a", 2}));
  EXPECT_TRUE(limiter.TakeHeldBack(t0 + seconds(30)).empty());
  EXPECT_FALSE(limiter.Admit("a", t0 + seconds(11)).log);  // the count went out at t0 + 10
}

TEST(PeerLogLimiterTest, AFloodFromManyAddressesSharesOneEntry) {
  PeerLogLimiter limiter(seconds(10));
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < PeerLogLimiter::kMaxPeers; ++i) {
    ASSERT_TRUE(limiter.Admit("peer" + std::to_string(i), t0).log);
  }
  EXPECT_FALSE(limiter.Admit("new1", t0).log);
  EXPECT_FALSE(limiter.Admit("new2", t0).log);
  auto held = limiter.TakeHeldBack(t0 + seconds(10));
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].first, PeerLogLimiter::kOtherPeers);
  EXPECT_EQ(held[0].second, 2u);
  EXPECT_TRUE(limiter.Admit("new3", t0 + seconds(10)).log);  // the quiet ones were forgotten
}

}  // namespace
}  // namespace kvrail::session
