#include "control/wire/digest.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "control/wire/dispatch.h"

namespace kvrail::wire {
namespace {

TEST(RoomDigestTest, RoundTripsAndIsNoCachePdMessage) {
  const std::vector<std::string> frames = BuildRoomDigest({42, 3, 0x0123456789abcdefULL}).value();
  EXPECT_TRUE(IsRoomDigest(frames));
  EXPECT_EQ(Classify(frames), MessageKind::kDropped);  // a CachePD peer drops it (§3.2.1)
  EXPECT_EQ(frames[3], std::string("\xef\xcd\xab\x89\x67\x45\x23\x01", 8));  // little-endian
  const RoomDigestMessage parsed = ParseRoomDigest(frames).value();
  EXPECT_EQ(parsed.room, 42u);
  EXPECT_EQ(parsed.prefill_rank, 3u);
  EXPECT_EQ(parsed.digest, 0x0123456789abcdefULL);
}

TEST(RoomDigestTest, EachRuleIsRefusedNamingItsFrame) {
  const std::vector<std::string> good = BuildRoomDigest({1, 0, 7}).value();
  struct Case {
    size_t frame;  // the frame changed (4: drop the last one)
    std::string value;
    std::string refusal;
  };
  const std::vector<Case> cases = {
      {4, "", "got 3 frames, requires exactly 4"},
      {1, "01", "frame 1 (room)"},
      {2, "1024", "frame 2 (rank)"},
      {3, "short", "frame 3 (digest) has 5 bytes, requires 8"},
      {0, "\xffkvrail.sender.v1", "frame 0 is not the room digest magic"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> frames = good;
    if (c.frame == 4) {
      frames.pop_back();
    } else {
      frames[c.frame] = c.value;
    }
    absl::StatusOr<RoomDigestMessage> parsed = ParseRoomDigest(frames);
    ASSERT_FALSE(parsed.ok()) << c.refusal;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), c.refusal)) << parsed.status();
  }
}

}  // namespace
}  // namespace kvrail::wire
