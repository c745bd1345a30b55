#include "control/session/ended_rooms.h"

#include <gtest/gtest.h>

namespace kvrail::session {
namespace {

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

RoomEvent End(uint64_t room, TransferPoll state, std::string reason = "") {
  RoomEvent event;
  event.room = room;
  event.state = state;
  event.reason = std::move(reason);
  event.cause = state == TransferPoll::kFailed ? FailureCause::kAborted : FailureCause::kNone;
  return event;
}

TEST(EndedRoomsTest, ARoomIsRememberedOnceAndRefusedWithItsTrueEnd) {
  EndedRooms ended(4);
  EXPECT_TRUE(ended.Remember(End(1, TransferPoll::kFailed, "aborted by the decode"), kT0, kT0));
  EXPECT_FALSE(ended.Remember(End(1, TransferPoll::kSuccess), kT0, kT0)) << "a second end";
  ASSERT_NE(ended.Find(1), nullptr);
  EXPECT_EQ(ended.Find(1)->state, TransferPoll::kFailed);
  EXPECT_EQ(ended.Refusal(1).message(), "room 1 already failed: aborted by the decode");
  EXPECT_TRUE(ended.Refusal(2).ok());
  EXPECT_EQ(ended.failed(), 1u);
}

TEST(EndedRoomsTest, TheNewestAreKeptAndAFailedRoomAtLeastUntilItsTime) {
  EndedRooms ended(2);
  ASSERT_TRUE(ended.Remember(End(1, TransferPoll::kFailed, "x"), kT0, kT0 + absl::Seconds(10)));
  ASSERT_TRUE(ended.Remember(End(2, TransferPoll::kSuccess), kT0, kT0));
  ASSERT_TRUE(ended.Remember(End(3, TransferPoll::kSuccess), kT0, kT0));
  // Over the bound, but room 1 is kept until its time, and 2 and 3 behind it.
  EXPECT_EQ(ended.size(), 3u);
  EXPECT_NE(ended.Find(1), nullptr);
  ended.Expire(kT0 + absl::Seconds(10));
  EXPECT_EQ(ended.Find(1), nullptr);
  EXPECT_NE(ended.Find(2), nullptr);
  EXPECT_NE(ended.Find(3), nullptr);
  EXPECT_EQ(ended.size(), 2u);
  EXPECT_EQ(ended.failed(), 0u);
  ASSERT_TRUE(ended.Remember(End(4, TransferPoll::kSuccess), kT0 + absl::Seconds(11), kT0));
  EXPECT_EQ(ended.Find(2), nullptr) << "the oldest goes first";
  EXPECT_EQ(ended.size(), 2u);
}

TEST(EndedRoomsTest, AForgottenRoomIdMayEndAgainAndIsNotForgottenByItsOldPlace) {
  EndedRooms ended(2);
  ASSERT_TRUE(ended.Remember(End(1, TransferPoll::kSuccess), kT0, kT0));
  ended.Forget(1);
  EXPECT_EQ(ended.Find(1), nullptr);
  ASSERT_TRUE(ended.Remember(End(2, TransferPoll::kSuccess), kT0, kT0));
  ASSERT_TRUE(ended.Remember(End(1, TransferPoll::kFailed, "again"), kT0, kT0));
  ASSERT_TRUE(ended.Remember(End(3, TransferPoll::kSuccess), kT0, kT0));
  // Room 1's old place was first in line: skipped, so 2 goes, and 1's new end stays.
  EXPECT_EQ(ended.Find(2), nullptr);
  ASSERT_NE(ended.Find(1), nullptr);
  EXPECT_EQ(ended.Find(1)->reason, "again");
}

}  // namespace
}  // namespace kvrail::session
