// The fence suite's tests (fence_suite.h); fence_test and netns_test instantiate them.
#include "tests/chaos/fence_suite.h"

namespace kvrail::chaos {

TEST_P(FenceTest, APrefillEngineAbortFailsTheRoomOnlyOnceNoWriteCanLand) {
  int mid_room = 0;
  uint64_t room = 1;
  for (absl::Duration delay : {absl::ZeroDuration(), absl::Milliseconds(5), absl::Milliseconds(20),
                               absl::Milliseconds(40), absl::Milliseconds(80)}) {
    const Trial trial = Run(room++, deployment_->prefill(), delay);
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

TEST_P(FenceTest, ADecodeEngineAbortHoldsThePagesUntilThePrefillFencedTheRoom) {
  int mid_room = 0;
  uint64_t room = 1;
  for (absl::Duration delay : {absl::ZeroDuration(), absl::Milliseconds(5), absl::Milliseconds(20),
                               absl::Milliseconds(40), absl::Milliseconds(80)}) {
    const Trial trial = Run(room++, deployment_->decode(0), delay);
    EXPECT_EQ(trial.after_free, 0u) << "bytes landed after the pages were freed";
    if (trial.failed) {
      EXPECT_TRUE(trial.proven) << trial.reason;
    }
    if (trial.failed && trial.landed_bytes > 0) ++mid_room;
  }
  EXPECT_GT(mid_room, 0);
  ExpectTheSidecarsServeOn(room);
}

}  // namespace kvrail::chaos
