#include "engine/transfer/lane_set.h"

#include <gtest/gtest.h>

#include <set>

namespace kvrail::transfer {
namespace {

TEST(LaneSetTest, TheDefaultIsEveryLane) {
  const LaneSet every;
  EXPECT_TRUE(every.Every());
  EXPECT_EQ(every.CountIn(4), 4);
  EXPECT_EQ(every.Describe(4), "every lane");
}

TEST(LaneSetTest, CountsHoldsAndDescribesAStridedSet) {
  const LaneSet odd{.first = 1, .step = 2};
  EXPECT_FALSE(odd.Every());
  EXPECT_EQ(odd.CountIn(4), 2);
  EXPECT_EQ(odd.CountIn(5), 2);
  EXPECT_EQ(odd.CountIn(1), 0);
  EXPECT_EQ(odd.Describe(4), "lanes 1, 3 of 4");
  EXPECT_EQ((LaneSet{.first = 1, .step = 2}).Describe(2), "lane 1 of 2");
}

// Each of a peer's lanes reads one writer where there are no more writers than lanes: the
// writers' sets are disjoint and cover every lane.
TEST(LaneSetTest, WritersIntoOnePeerEachTakeLanesOfTheirOwn) {
  for (int lanes = 1; lanes <= 8; ++lanes) {
    for (int writers = 2; writers <= lanes; ++writers) {
      std::set<int> taken;
      for (int writer = 0; writer < writers; ++writer) {
        const LaneSet set = WriterLanes(lanes, writers, writer);
        ASSERT_GE(set.CountIn(lanes), 1) << lanes << " lanes, writer " << writer;
        for (int lane = set.first; lane < lanes; lane += set.step) {  // as the scheduler walks it
          EXPECT_TRUE(taken.insert(lane).second)
              << "lane " << lane << " of " << lanes << " taken twice, " << writers << " writers";
        }
      }
      EXPECT_EQ(taken.size(), static_cast<size_t>(lanes));
    }
  }
  // A writer's index past the writers wraps (writer % writers).
  EXPECT_EQ(WriterLanes(2, 2, 3), (LaneSet{.first = 1, .step = 2}));
}

// A set that is no set holds no lane and says so (Submit refuses it: scheduler_test).
TEST(LaneSetTest, ASetThatIsNoSetHoldsNoLane) {
  EXPECT_EQ((LaneSet{.first = 0, .step = 0}).CountIn(4), 0);
  EXPECT_EQ((LaneSet{.first = -1, .step = 1}).CountIn(4), 0);
  EXPECT_EQ((LaneSet{.first = 4, .step = 1}).CountIn(4), 0);
  EXPECT_EQ((LaneSet{.first = 0, .step = 0}).Describe(4), "no lane of 4");
  EXPECT_EQ((LaneSet{.first = 5, .step = 2}).Describe(4), "no lane of 4");
}

TEST(LaneSetTest, OneWriterOrMoreWritersThanLanesTakeEveryLane) {
  EXPECT_TRUE(WriterLanes(2, 1, 0).Every());
  EXPECT_TRUE(WriterLanes(2, 4, 1).Every());
  EXPECT_TRUE(WriterLanes(1, 2, 1).Every());
  EXPECT_TRUE(WriterLanes(4, 0, 0).Every());
}

}  // namespace
}  // namespace kvrail::transfer
