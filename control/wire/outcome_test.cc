#include "control/wire/outcome.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

using ::testing::HasSubstr;

TEST(RoomOutcomeTest, AnOutcomeRoundTripsAndIsKvrailsOwn) {
  const RoomOutcomeMessage sent{7, 1, 4096, 3, "aborted", "aborted by its engine: preempted"};
  absl::StatusOr<std::vector<std::string>> frames = BuildRoomOutcome(sent);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_TRUE(IsRoomOutcome(*frames));
  EXPECT_EQ(static_cast<unsigned char>((*frames)[0][0]), 0xFF);  // not ASCII: CachePD drops it
  absl::StatusOr<RoomOutcomeMessage> parsed = ParseRoomOutcome(*frames);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->room, 7u);
  EXPECT_EQ(parsed->prefill_rank, 1u);
  EXPECT_EQ(parsed->bytes, 4096u);
  EXPECT_EQ(parsed->copies, 3u);
  EXPECT_EQ(parsed->cause, "aborted");
  EXPECT_EQ(parsed->reason, "aborted by its engine: preempted");
}

TEST(RoomOutcomeTest, MalformedOutcomesAreRefusedNamingTheFrame) {
  std::vector<std::string> good = *BuildRoomOutcome({7, 1, 0, 0, "timeout", "late"});
  std::vector<std::string> bad = good;
  bad[1] = "07";
  EXPECT_THAT(ParseRoomOutcome(bad).status().message(), HasSubstr("frame 1 (room)"));
  bad = good;
  bad[2] = "1024";
  EXPECT_THAT(ParseRoomOutcome(bad).status().message(), HasSubstr("frame 2 (rank)"));
  bad = good;
  bad[5] = "Time out";
  EXPECT_THAT(ParseRoomOutcome(bad).status().message(), HasSubstr("frame 5 (cause)"));
  bad = good;
  bad[6] = "two\nlines";
  EXPECT_THAT(ParseRoomOutcome(bad).status().message(), HasSubstr("frame 6 (reason)"));
  bad = good;
  bad[6] = std::string(kMaxOutcomeReasonBytes + 1, 'x');
  EXPECT_THAT(ParseRoomOutcome(bad).status().message(), HasSubstr("frame 6 (reason)"));
  bad = good;
  bad.pop_back();
  EXPECT_EQ(CategoryOf(ParseRoomOutcome(bad).status()), ErrorCategory::kInvalidFrame);
}

}  // namespace
}  // namespace kvrail::wire
