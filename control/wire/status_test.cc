#include "control/wire/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using Frames = std::vector<std::string>;

void ExpectStrictError(const Frames& frames, const std::string& substring) {
  absl::Status status = ParseStatus(frames).status();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
}

void ExpectLenientError(const Frames& frames, const std::string& substring) {
  absl::Status status = ParseStatusLenient(frames).status();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
}

TEST(BuildStatusTest, FailedWithoutTokenOrIds) {
  auto frames = BuildStatus({9223372036854775807ULL, 0, 3, -1, std::nullopt});
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames, (Frames{"9223372036854775807", "0", "3", "-1", ""}));
}

TEST(BuildStatusTest, SuccessWithTokenAndLittleEndianIds) {
  auto frames = BuildStatus({42, 5, 1, 151643, std::vector<int32_t>{7, -1}});
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames,
            (Frames{"42", "5", "1", "151643", std::string("\x07\0\0\0\xff\xff\xff\xff", 8)}));
}

TEST(BuildStatusTest, EmptyIdListIsSentAsAnEmptyFrameAndReadsBackAsNone) {
  auto frames = BuildStatus({42, 5, 0, 9, std::vector<int32_t>{}});
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ((*frames)[4], "");
  EXPECT_EQ(ParseStatus(*frames)->spec_candidate_ids, std::nullopt);
}

TEST(BuildStatusTest, RejectsWhatTheStrictParserRejects) {
  const std::vector<std::pair<StatusMessage, std::string>> cases = {
      {{uint64_t{1} << 63, 5, 0, -1, std::nullopt}, "frame 0 (room)"},
      {{1, 6, 0, -1, std::nullopt}, "frame 1 (status): 6 is out of range [0, 5]"},
      {{1, -1, 0, -1, std::nullopt}, "frame 1 (status)"},
      {{1, 5, 1024, -1, std::nullopt}, "frame 2 (prefill rank): 1024 is out of range"},
      {{1, 5, 0, -2, std::nullopt}, "frame 3 (bootstrap token): \"-2\""},
  };
  for (const auto& [message, substring] : cases) {
    absl::Status status = BuildStatus(message).status();
    ASSERT_FALSE(status.ok()) << substring;
    EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame);
    EXPECT_THAT(std::string(status.message()), StartsWith("cannot build status: "));
    EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
  }
}

TEST(ParseStatusTest, ReadsEveryMember) {
  auto message = ParseStatus(Frames{"42", "5", "1", "100", std::string("\x01\0\0\0\x02\0\0\0", 8)});
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(*message, (StatusMessage{42, 5, 1, 100, std::vector<int32_t>{1, 2}}));
}

TEST(ParseStatusTest, MinusOneIsTheOnlyNegativeToken) {
  EXPECT_EQ(ParseStatus(Frames{"1", "0", "0", "-1", ""})->bootstrap_token, -1);
  ExpectStrictError(Frames{"1", "0", "0", "-2", ""},
                    "status frame 3 (bootstrap token): \"-2\" must be \"-1\" (no token) or "
                    "canonical unsigned ASCII");
  ExpectStrictError(Frames{"1", "0", "0", "-01", ""}, "frame 3 (bootstrap token)");
  ExpectStrictError(Frames{"1", "0", "0", "", ""}, "frame 3 (bootstrap token)");
  ExpectStrictError(Frames{"1", "0", "0", "9223372036854775808", ""}, "is out of range");
  EXPECT_EQ(ParseStatus(Frames{"1", "0", "0", "9223372036854775807", ""})->bootstrap_token,
            9223372036854775807LL);
}

TEST(ParseStatusTest, RequiresExactlyFiveFrames) {
  ExpectStrictError(Frames{"42", "5", "1"}, "status: got 3 frames, requires exactly 5");
  ExpectStrictError(Frames{"42", "5", "1", "-1", "", ""}, "got 6 frames");
}

TEST(ParseStatusTest, IntegersAreCanonical) {
  ExpectStrictError(Frames{" 42", "5", "1", "-1", ""}, "status frame 0 (room)");
  ExpectStrictError(Frames{"42", "+5", "1", "-1", ""}, "status frame 1 (status)");
  ExpectStrictError(Frames{"42", "5", "01", "-1", ""}, "status frame 2 (prefill rank)");
  ExpectStrictError(Frames{"42", "5", "1", "1_0", ""}, "status frame 3 (bootstrap token)");
}

TEST(ParseStatusTest, StatusIsATransferPollCode) {
  for (int code = 0; code <= 5; ++code) {
    EXPECT_EQ(ParseStatus(Frames{"1", std::to_string(code), "0", "-1", ""})->status, code);
  }
  ExpectStrictError(Frames{"1", "9", "0", "-1", ""}, "frame 1 (status): 9 is out of range [0, 5]");
}

TEST(ParseStatusTest, RankIsBelow1024) {
  EXPECT_EQ(ParseStatus(Frames{"1", "5", "1023", "-1", ""})->prefill_rank, 1023u);
  ExpectStrictError(Frames{"1", "5", "1024", "-1", ""}, "frame 2 (prefill rank): 1024");
}

TEST(ParseStatusTest, IdFrameIsAMultipleOfFourBytes) {
  ExpectStrictError(Frames{"1", "5", "0", "-1", "abc"},
                    "status frame 4 (speculative ids): 3 bytes, must be a multiple of 4");
}

TEST(ParseStatusLenientTest, ReadsIntegersLikePythonInt) {
  auto message = ParseStatusLenient(Frames{" 42 ", "+5", "001", "1_0"});
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(*message, (StatusMessage{42, 5, 1, 10, std::nullopt}));
}

TEST(ParseStatusLenientTest, TokenAndIdsAreOptionalAndExtraFramesIgnored) {
  EXPECT_EQ(*ParseStatusLenient(Frames{"42", "5", "1"}), (StatusMessage{42, 5, 1, -1, {}}));
  EXPECT_EQ(*ParseStatusLenient(Frames{"42", "5", "1", "7", "", "junk", "\xff"}),
            (StatusMessage{42, 5, 1, 7, {}}));
}

TEST(ParseStatusLenientTest, AcceptsAnyIntStatusAndAnyInt64Token) {
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "9", "0"})->status, 9);
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "-3", "0"})->status, -3);
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "5", "0", "-7"})->bootstrap_token, -7);
}

TEST(ParseStatusLenientTest, RequiresAtLeastThreeFrames) {
  ExpectLenientError(Frames{"42", "5"}, "status: got 2 frames, requires at least 3 (CACHEPD §3.4)");
}

TEST(ParseStatusLenientTest, RejectsNonAsciiAndNonDecimalText) {
  ExpectLenientError(Frames{"\xd9\xa4", "5", "0"}, "status frame 0 (room): byte 0xd9");
  ExpectLenientError(Frames{"42", "0x5", "0"}, "status frame 1 (status): \"0x5\" is not a base-10");
  ExpectLenientError(Frames{"42", "5", "0", ""}, "status frame 3 (bootstrap token)");
}

TEST(ParseStatusLenientTest, IdFrameIsNotDecodedAsText) {
  auto message = ParseStatusLenient(Frames{"42", "5", "0", "1", std::string(4, '\xff')});
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->spec_candidate_ids, std::vector<int32_t>{-1});
  ExpectLenientError(Frames{"42", "5", "0", "1", "\x01\x02\x03"}, "multiple of 4");
}

// Divergences from the reference, documented in status.h.
TEST(ParseStatusLenientTest, RejectsRoomsThatCannotBeTracked) {
  ExpectLenientError(Frames{"1180591620717411303424", "5", "0"},
                     "status frame 0 (room): 1180591620717411303424 is out of range "
                     "[0, 9223372036854775807] (CACHEPD §3.4)");
  ExpectLenientError(Frames{"-1", "5", "0"}, "status frame 0 (room): -1 is out of range");
}

TEST(ParseStatusLenientTest, RejectsValuesBeyondTheStructTypes) {
  ExpectLenientError(Frames{"1", "2147483648", "0"},
                     "frame 1 (status): 2147483648 is out of range");
  ExpectLenientError(Frames{"1", "5", "-1"}, "frame 2 (prefill rank): -1 is out of range");
  ExpectLenientError(Frames{"1", "5", "4294967296"}, "frame 2 (prefill rank)");
  ExpectLenientError(Frames{"1", "5", "0", "9223372036854775808"}, "frame 3 (bootstrap token)");
}

TEST(ParseStatusLenientTest, AcceptsEverythingTheStrictParserAccepts) {
  const Frames frames = {"42", "5", "1", "-1", std::string("\x01\0\0\0", 4)};
  ASSERT_TRUE(ParseStatus(frames).ok());
  EXPECT_EQ(*ParseStatusLenient(frames), *ParseStatus(frames));
}

}  // namespace
}  // namespace kvrail::wire
