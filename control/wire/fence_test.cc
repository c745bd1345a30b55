#include "control/wire/fence.h"

#include <gtest/gtest.h>

#include "control/wire/dispatch.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

TEST(FenceTest, ARequestRoundTrips) {
  const std::vector<std::string> frames =
      BuildFenceRequest({.room = 42, .session_id = "127.0.0.1:5000"}).value();
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[1], "42");
  EXPECT_TRUE(IsFenceRequest(frames));
  EXPECT_FALSE(IsFencedAnswer(frames));
  const FenceRequest parsed = ParseFenceRequest(frames).value();
  EXPECT_EQ(parsed.room, 42u);
  EXPECT_EQ(parsed.session_id, "127.0.0.1:5000");
}

TEST(FenceTest, AnAnswerRoundTrips) {
  const std::vector<std::string> frames = BuildFencedAnswer({.room = 7, .prefill_rank = 3}).value();
  EXPECT_TRUE(IsFencedAnswer(frames));
  const FencedAnswer parsed = ParseFencedAnswer(frames).value();
  EXPECT_EQ(parsed.room, 7u);
  EXPECT_EQ(parsed.prefill_rank, 3u);
  EXPECT_TRUE(parsed.proven);
  EXPECT_FALSE(
      ParseFencedAnswer(BuildFencedAnswer({.room = 7, .prefill_rank = 3, .proven = false}).value())
          ->proven);
}

// A CachePD peer that is not kvrail drops both (CACHEPD §3.2.1: frame 0 not ASCII).
TEST(FenceTest, ACachePdPrefillDropsAFenceRequest) {
  const std::vector<std::string> frames =
      BuildFenceRequest({.room = 1, .session_id = "h:1"}).value();
  EXPECT_EQ(Classify(frames), MessageKind::kDropped);
}

TEST(FenceTest, MalformedMessagesAreInvalidFramesNamingTheRule) {
  const std::string magic(kFenceRequestMagic);
  struct Case {
    std::vector<std::string> frames;
    std::string says;
  };
  const Case cases[] = {
      {{magic, "1"}, "requires exactly 3"},
      {{magic, "01", "h:1"}, "frame 1 (room)"},
      {{magic, "9223372036854775808", "h:1"}, "frame 1 (room)"},
      {{magic, "1", ""}, "frame 2 (session id)"},
      {{magic, "1", std::string(513, 'a')}, "frame 2 (session id)"},
      {{"kvrail.fence.v1", "1", "h:1"}, "magic"},
  };
  for (const Case& c : cases) {
    const absl::Status status = ParseFenceRequest(c.frames).status();
    EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame) << status;
    EXPECT_NE(status.message().find(c.says), std::string::npos) << status;
  }
  const std::string fenced(kFencedMagic);
  EXPECT_FALSE(ParseFencedAnswer({fenced, "1", "1024", "proven"}).ok());
  EXPECT_FALSE(ParseFencedAnswer({fenced, "x", "1", "proven"}).ok());
  EXPECT_FALSE(ParseFencedAnswer({fenced, "1", "1"}).ok());
  EXPECT_FALSE(ParseFencedAnswer({fenced, "1", "1", "maybe"}).ok());
  EXPECT_FALSE(BuildFenceRequest({.room = 1, .session_id = ""}).ok());
}

}  // namespace
}  // namespace kvrail::wire
