#include "control/wire/row_staging.h"

#include <gtest/gtest.h>

#include "control/wire/dispatch.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

TEST(RowStagingTest, AnOfferRoundTrips) {
  const std::vector<std::string> frames =
      BuildStagingOffer(
          {.room = 42, .session_id = "127.0.0.1:5000", .address = 140000000, .bytes = 65536})
          .value();
  ASSERT_EQ(frames.size(), 5u);
  EXPECT_EQ(frames[3], "140000000");
  EXPECT_TRUE(IsStagingOffer(frames));
  EXPECT_FALSE(IsStagingAnswer(frames));
  const StagingOffer parsed = ParseStagingOffer(frames).value();
  EXPECT_EQ(parsed.room, 42u);
  EXPECT_EQ(parsed.session_id, "127.0.0.1:5000");
  EXPECT_EQ(parsed.address, 140000000u);
  EXPECT_EQ(parsed.bytes, 65536u);
}

TEST(RowStagingTest, AnAnswerRoundTripsBothWays) {
  for (const bool staged : {true, false}) {
    const std::vector<std::string> frames =
        BuildStagingAnswer({.room = 7, .prefill_rank = 3, .staged = staged}).value();
    EXPECT_EQ(frames[3], staged ? "staged" : "in_place");
    EXPECT_TRUE(IsStagingAnswer(frames));
    const StagingAnswer parsed = ParseStagingAnswer(frames).value();
    EXPECT_EQ(parsed.room, 7u);
    EXPECT_EQ(parsed.prefill_rank, 3u);
    EXPECT_EQ(parsed.staged, staged);
  }
}

// A CachePD peer that is not kvrail drops both (CACHEPD §3.2.1: frame 0 not ASCII).
TEST(RowStagingTest, ACachePdPeerDropsBoth) {
  EXPECT_EQ(Classify(BuildStagingOffer({1, "h:1", 4096, 1}).value()), MessageKind::kDropped);
  EXPECT_EQ(Classify(BuildStagingAnswer({1, 0, true}).value()), MessageKind::kDropped);
}

TEST(RowStagingTest, MalformedMessagesAreInvalidFramesNamingTheRule) {
  const std::string offer(kStagingOfferMagic);
  const std::string answer(kStagingAnswerMagic);
  struct Case {
    std::vector<std::string> frames;
    std::string says;
  };
  const Case offers[] = {
      {{offer, "1", "h:1", "4096"}, "requires exactly 5"},
      {{offer, "01", "h:1", "4096", "8"}, "frame 1 (room)"},
      {{offer, "1", "", "4096", "8"}, "frame 2 (session id)"},
      {{offer, "1", std::string(513, 'a'), "4096", "8"}, "frame 2 (session id)"},
      {{offer, "1", "h:1", "0", "8"}, "frame 3 (address)"},
      {{offer, "1", "h:1", "4096", "0"}, "frame 4 (bytes)"},
      {{offer, "1", "h:1", "18446744073709551615", "2"}, "wraps around the address space"},
      {{"kvrail.staging.v1", "1", "h:1", "4096", "8"}, "magic"},
  };
  for (const Case& c : offers) {
    const absl::Status status = ParseStagingOffer(c.frames).status();
    EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame) << status;
    EXPECT_NE(status.message().find(c.says), std::string::npos) << status;
  }
  const Case answers[] = {
      {{answer, "1", "0"}, "requires exactly 4"},
      {{answer, "x", "0", "staged"}, "frame 1 (room)"},
      {{answer, "1", "1024", "staged"}, "frame 2 (prefill rank)"},
      {{answer, "1", "0", "yes"}, "frame 3 must be \"staged\" or \"in_place\""},
  };
  for (const Case& c : answers) {
    const absl::Status status = ParseStagingAnswer(c.frames).status();
    EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame) << status;
    EXPECT_NE(status.message().find(c.says), std::string::npos) << status;
  }
  EXPECT_FALSE(BuildStagingOffer({1, "h:1", 0, 8}).ok());
}

}  // namespace
}  // namespace kvrail::wire
