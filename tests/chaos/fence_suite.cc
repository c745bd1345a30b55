// The fence suite's tests (fence_suite.h); fence_test and netns_test instantiate them.
#include "tests/chaos/fence_suite.h"

namespace kvrail::chaos {

// Aborts by `who` at five points of a room's life: no byte lands after the pages were freed,
// every failed room's release is proven, and the sidecars serve on.
void FenceTest::ExpectEveryAbortFenced(Rank& who) {
  int mid_room = 0;
  uint64_t room = 1;
  for (absl::Duration delay : {absl::ZeroDuration(), absl::Milliseconds(5), absl::Milliseconds(20),
                               absl::Milliseconds(40), absl::Milliseconds(80)}) {
    const Trial trial = Run(room++, who, delay);
    EXPECT_EQ(trial.after_free, 0u) << "bytes landed after the pages were freed";
    if (trial.failed) {
      EXPECT_TRUE(trial.proven) << trial.reason;
    }
    if (trial.failed && trial.landed_bytes > 0) ++mid_room;
  }
  // At least one abort came while the room's writes were moving, or the test proved nothing.
  EXPECT_GT(mid_room, 0);
  ExpectTheSidecarsServeOn(room);
}

TEST_P(FenceTest, APrefillEngineAbortFailsTheRoomOnlyOnceNoWriteCanLand) {
  ExpectEveryAbortFenced(deployment_->prefill());
}

TEST_P(FenceTest, ADecodeEngineAbortHoldsThePagesUntilThePrefillFencedTheRoom) {
  ExpectEveryAbortFenced(deployment_->decode(0));
}

}  // namespace kvrail::chaos
