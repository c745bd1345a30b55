#include "control/sidecar/staging_slots.h"

#include <gtest/gtest.h>

namespace kvrail::sidecar {
namespace {

TEST(StagingSlotsTest, SlotsAreTakenFirstFitAlignedAndComeBack) {
  StagingSlots slots(64 << 10, 4096);
  EXPECT_EQ(slots.Take(5000), 0u);  // 8 KiB taken
  EXPECT_EQ(slots.Take(4096), 8192u);
  EXPECT_EQ(slots.Take(1), 12288u);
  EXPECT_EQ(slots.taken_bytes(), 16384u);
  EXPECT_TRUE(slots.Give(8192));
  EXPECT_FALSE(slots.Give(8192)) << "given twice";
  EXPECT_FALSE(slots.Give(100)) << "no slot there";
  EXPECT_EQ(slots.Take(4000), 8192u) << "the gap it left is the first fit";
  EXPECT_EQ(slots.Take(8192), 16384u) << "too big for any gap: after the last";
  EXPECT_EQ(slots.taken(), 4u);
}

TEST(StagingSlotsTest, NothingIsTakenWhenNoGapHoldsIt) {
  StagingSlots slots(16384, 4096);
  EXPECT_FALSE(slots.Take(0).has_value());
  EXPECT_FALSE(slots.Take(16385).has_value());
  EXPECT_FALSE(slots.Take(UINT64_MAX).has_value());
  EXPECT_EQ(slots.Take(8192), 0u);
  EXPECT_EQ(slots.Take(8192), 8192u);
  EXPECT_FALSE(slots.Take(1).has_value());
  EXPECT_TRUE(slots.Give(0));
  EXPECT_FALSE(slots.Take(8193).has_value());
  EXPECT_EQ(slots.Take(8192), 0u);
  EXPECT_EQ(slots.taken_bytes(), 16384u);
}

}  // namespace
}  // namespace kvrail::sidecar
