#include "control/plan/dp_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace kvrail::plan {
namespace {

using ::testing::HasSubstr;

TEST(DpGroupOf, IsRoomModTheDpSizeWhetherOrNotTheEngineNamesIt) {
  EXPECT_EQ(DpGroupOf(6, 4, std::nullopt).value(), 2);
  EXPECT_EQ(DpGroupOf(6, 4, 2).value(), 2);
  EXPECT_EQ(DpGroupOf(7, 1, std::nullopt).value(), 0);
  EXPECT_EQ(DpGroupOf(uint64_t{1} << 63, 3, std::nullopt).value(),
            static_cast<int>((uint64_t{1} << 63) % 3));
}

TEST(DpGroupOf, AnotherGroupIsRefusedNamingBothAndTheRule) {
  const absl::Status refused = DpGroupOf(6, 4, 1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("Expect.dp_group 1 is not where CachePD routes room 6: room mod "
                        "prefill_dp_size (4) = 2 (CACHEPD §1.3, D4)"));
}

TEST(DpGroupOf, AGroupOutsideTheNodeIsRefusedNamingItsSize) {
  EXPECT_THAT(std::string(DpGroupOf(6, 4, 4).status().message()),
              HasSubstr("Expect.dp_group 4: the prefill node has 4 DP group(s)"));
  EXPECT_THAT(std::string(DpGroupOf(6, 4, -1).status().message()), HasSubstr("Expect.dp_group -1"));
  EXPECT_FALSE(DpGroupOf(6, 0, std::nullopt).ok());
}

}  // namespace
}  // namespace kvrail::plan
