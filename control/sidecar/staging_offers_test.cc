#include "control/sidecar/staging_offers.h"

#include <gtest/gtest.h>

namespace kvrail::sidecar {
namespace {

wire::StagingOffer Offer(const std::string& session, uint64_t room) {
  return {room, session, 4096 + room, 64};
}

TEST(StagingOffersTest, AnOfferIsTakenOnceForItsSessionAndRoom) {
  StagingOffers offers;
  offers.Keep(Offer("a:1", 7));
  EXPECT_FALSE(offers.Take("b:1", 7).has_value());
  EXPECT_FALSE(offers.Take("a:1", 8).has_value());
  const std::optional<wire::StagingOffer> taken = offers.Take("a:1", 7);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->address, 4103u);
  EXPECT_FALSE(offers.Take("a:1", 7).has_value()) << "taken twice";
  offers.Keep(Offer("a:1", 7));
  offers.Keep({7, "a:1", 9999, 1});  // the same room offered again: the later offer holds
  EXPECT_EQ(offers.Take("a:1", 7)->address, 9999u);
}

TEST(StagingOffersTest, TheOldestAreForgottenPastTheBoundAndTakenOnesDoNotCount) {
  StagingOffers offers(/*bound=*/3);
  for (uint64_t room = 0; room < 5; ++room) offers.Keep(Offer("a:1", room));
  EXPECT_EQ(offers.size(), 3u);
  EXPECT_FALSE(offers.Take("a:1", 0).has_value());
  EXPECT_FALSE(offers.Take("a:1", 1).has_value());
  EXPECT_TRUE(offers.Take("a:1", 2).has_value());
  // A room kept again after it was taken is the newest, not the oldest.
  offers.Keep(Offer("a:1", 2));
  offers.Keep(Offer("a:1", 5));
  EXPECT_TRUE(offers.Take("a:1", 2).has_value());
  // Many offers kept and taken behind one that stays leave nothing behind.
  for (uint64_t room = 100; room < 10000; ++room) {
    offers.Keep(Offer("b:1", room));
    ASSERT_TRUE(offers.Take("b:1", room).has_value());
  }
  EXPECT_EQ(offers.size(), 2u);  // rooms 4 and 5 of a:1
  EXPECT_TRUE(offers.Take("a:1", 4).has_value());
}

TEST(StagingOffersTest, ADroppedSessionsOffersGoWithIt) {
  StagingOffers offers;
  offers.Keep(Offer("a:1", 1));
  offers.Keep(Offer("a:1", 2));
  offers.Keep(Offer("a:10", 1));
  offers.ForgetSession("a:1");
  EXPECT_EQ(offers.size(), 1u);
  EXPECT_TRUE(offers.Take("a:10", 1).has_value());
}

}  // namespace
}  // namespace kvrail::sidecar
