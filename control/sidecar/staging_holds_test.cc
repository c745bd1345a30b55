// StagingHolds: a staged decode room's page release waits for every copy back into its pages.
#include "control/sidecar/staging_holds.h"

#include <gtest/gtest.h>

namespace kvrail::sidecar {
namespace {

session::PagesRelease ReleaseOf(uint64_t room, bool proven) {
  session::PagesRelease release;
  release.room = room;
  release.proven = proven;
  return release;
}

TEST(StagingHoldsTest, AReleaseWithNoCopyRunningIsNotHeld) {
  StagingHolds holds;
  EXPECT_FALSE(holds.Hold(ReleaseOf(7, true)));
  EXPECT_TRUE(holds.End(7).empty());  // an End without a Begin changes nothing
  EXPECT_EQ(holds.rooms(), 0u);
}

TEST(StagingHoldsTest, AReleaseDuringACopyWaitsForTheRoomsLastCopyToReturn) {
  StagingHolds holds;
  holds.Begin(7);
  holds.Begin(7);  // two prefill ranks' Successes, copied back in turn
  holds.Begin(8);
  ASSERT_TRUE(holds.Hold(ReleaseOf(7, true)));
  EXPECT_TRUE(holds.End(7).empty()) << "one copy into room 7 still runs";
  const std::vector<session::PagesRelease> released = holds.End(7);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].room, 7u);
  EXPECT_TRUE(released[0].proven);
  EXPECT_EQ(holds.rooms(), 1u);  // room 8's copy is its own
  EXPECT_FALSE(holds.Hold(ReleaseOf(7, false))) << "room 7 has no copy running any more";
  EXPECT_TRUE(holds.End(8).empty());
  EXPECT_EQ(holds.rooms(), 0u);
}

TEST(StagingHoldsTest, HeldReleasesComeBackInTheOrderTheyCame) {
  StagingHolds holds;
  holds.Begin(3);
  ASSERT_TRUE(holds.Hold(ReleaseOf(3, false)));
  ASSERT_TRUE(holds.Hold(ReleaseOf(3, true)));
  const std::vector<session::PagesRelease> released = holds.End(3);
  ASSERT_EQ(released.size(), 2u);
  EXPECT_FALSE(released[0].proven);
  EXPECT_TRUE(released[1].proven);
}

}  // namespace
}  // namespace kvrail::sidecar
