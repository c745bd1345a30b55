#include "control/wire/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "control/wire/limits.h"
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

// CACHEPD §12.9: frame 5 canonical decimal, frame 6 the little-endian double.
TEST(BuildStatusTest, The2026_09FormAppendsCachedTokensAndTheLittleEndianLogprob) {
  StatusMessage message{42, 5, 1, 151643, std::vector<int32_t>{7, 8, -1}};
  message.cached_tokens = 128;
  message.bootstrap_logprob = -0.015625;
  auto frames = BuildStatus(message, StatusForm::k2026_09);
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->size(), 7u);
  EXPECT_EQ((*frames)[5], "128");
  EXPECT_EQ((*frames)[6], std::string("\0\0\0\0\0\0\x90\xbf", 8));
}

TEST(BuildStatusTest, The2026_09FormSendsNoLogprobAsAnEmptyFrameAndZeroCachedTokens) {
  auto frames = BuildStatus({44, 0, 1, -1, std::nullopt}, StatusForm::k2026_09);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames, (Frames{"44", "0", "1", "-1", "", "0", ""}));
}

TEST(BuildStatusTest, TheSnapshotFormLeavesCachedTokensAndLogprobOut) {
  StatusMessage message{42, 5, 1, 7, std::nullopt};
  message.cached_tokens = 128;
  message.bootstrap_logprob = -0.5;
  auto frames = BuildStatus(message, StatusForm::kSnapshot);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames, (Frames{"42", "5", "1", "7", ""}));
}

TEST(BuildStatusTest, The2026_09FormRejectsWhatTheStrictParserRejects) {
  StatusMessage negative{1, 5, 0, -1, std::nullopt};
  negative.cached_tokens = -1;
  StatusMessage too_many{1, 5, 0, -1, std::nullopt};
  too_many.cached_tokens = kMaxCachedTokens + 1;
  StatusMessage nan{1, 5, 0, -1, std::nullopt};
  nan.bootstrap_logprob = std::numeric_limits<double>::quiet_NaN();
  StatusMessage plus_inf{1, 5, 0, -1, std::nullopt};
  plus_inf.bootstrap_logprob = std::numeric_limits<double>::infinity();
  for (const auto& [message, substring] : std::vector<std::pair<StatusMessage, std::string>>{
           {negative, "status frame 5 (cached tokens)"},
           {too_many, "status frame 5 (cached tokens): 281474976710657 is out of range"},
           {nan, "status frame 6 (bootstrap logprob): nan is not a log-probability"},
           {plus_inf, "status frame 6 (bootstrap logprob): inf is not a log-probability"}}) {
    absl::Status status = BuildStatus(message, StatusForm::k2026_09).status();
    ASSERT_FALSE(status.ok()) << substring;
    EXPECT_THAT(std::string(status.message()), StartsWith("cannot build status: "));
    EXPECT_THAT(std::string(status.message()), HasSubstr(substring));
    // The snapshot form does not carry them, so they do not matter there.
    EXPECT_TRUE(BuildStatus(message, StatusForm::kSnapshot).ok()) << substring;
  }
}

TEST(ParseStatusTest, ReportsTheFormItReadTheMessageIn) {
  EXPECT_EQ(ParseStatus(Frames{"42", "5", "1", "-1", ""})->form, StatusForm::kSnapshot);
  EXPECT_EQ(ParseStatus(Frames{"42", "5", "1", "-1", "", "3"})->form, StatusForm::k2026_09);
  EXPECT_EQ(ParseStatus(Frames{"42", "5", "1", "-1", "", "3", ""})->form, StatusForm::k2026_09);
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "5", "1"})->form, StatusForm::kSnapshot);
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "5", "1", "-1", "", "3", "", "x"})->form,
            StatusForm::k2026_09);
}

TEST(ParseStatusTest, FewerThanSevenFramesMeanZeroCachedTokensAndNoLogprob) {
  auto five = ParseStatus(Frames{"42", "5", "1", "-1", ""});
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->cached_tokens, 0);
  EXPECT_EQ(five->bootstrap_logprob, std::nullopt);
  auto six = ParseStatus(Frames{"42", "5", "1", "-1", "", "17"});
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(six->cached_tokens, 17);
  EXPECT_EQ(six->bootstrap_logprob, std::nullopt);
}

TEST(ParseStatusTest, CachedTokensAreCanonicalAndAtMost2To48) {
  EXPECT_EQ(ParseStatus(Frames{"1", "5", "0", "-1", "", "281474976710656", ""})->cached_tokens,
            kMaxCachedTokens);
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "281474976710657", ""},
                    "status frame 5 (cached tokens): 281474976710657 is out of range");
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "", ""}, "status frame 5 (cached tokens)");
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "-1", ""}, "status frame 5 (cached tokens)");
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", " 12", ""}, "status frame 5 (cached tokens)");
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "012", ""}, "status frame 5 (cached tokens)");
}

TEST(ParseStatusTest, LogprobIsEmptyOrEightLittleEndianBytes) {
  auto message =
      ParseStatus(Frames{"1", "5", "0", "-1", "", "0", std::string("\0\0\0\0\0\0\xd0\xbf", 8)});
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->bootstrap_logprob, -0.25);
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "0", std::string(9, '\0')},
                    "status frame 6 (bootstrap logprob): 9 bytes, must be empty (none) or "
                    "exactly 8");
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "0", std::string(7, '\0')}, "7 bytes");
}

TEST(ParseStatusTest, RefusesNanAndPlusInfinityButAcceptsMinusInfinity) {
  const std::string nan("\0\0\0\0\0\0\xf8\x7f", 8);
  const std::string plus_inf("\0\0\0\0\0\0\xf0\x7f", 8);
  const std::string minus_inf("\0\0\0\0\0\0\xf0\xff", 8);
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "0", nan}, "is not a log-probability");
  ExpectStrictError(Frames{"1", "5", "0", "-1", "", "0", plus_inf}, "is not a log-probability");
  EXPECT_EQ(ParseStatus(Frames{"1", "5", "0", "-1", "", "0", minus_inf})->bootstrap_logprob,
            -std::numeric_limits<double>::infinity());
  // The lenient reader accepts all three, as the reference does (CACHEPD §12.9).
  EXPECT_TRUE(std::isnan(
      *ParseStatusLenient(Frames{"1", "5", "0", "-1", "", "0", nan})->bootstrap_logprob));
  EXPECT_EQ(ParseStatusLenient(Frames{"1", "5", "0", "-1", "", "0", plus_inf})->bootstrap_logprob,
            std::numeric_limits<double>::infinity());
}

TEST(ParseStatusLenientTest, ReadsCachedTokensLikePythonIntAndAcceptsNegativeCounts) {
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "5", "1", "100", "", " +1_000 "})->cached_tokens, 1000);
  EXPECT_EQ(ParseStatusLenient(Frames{"42", "5", "1", "100", "", "-3", ""})->cached_tokens, -3);
  ExpectLenientError(Frames{"42", "5", "1", "100", "", ""}, "status frame 5 (cached tokens)");
  ExpectLenientError(Frames{"42", "5", "1", "100", "", "12.5"}, "status frame 5 (cached tokens)");
}

TEST(ParseStatusLenientTest, ReadsTheLogprobBeforeTheCachedTokens) {
  ExpectLenientError(Frames{"42", "5", "1", "100", "", "x", std::string(1, '\0')},
                     "status frame 6 (bootstrap logprob): 1 bytes");
}

TEST(ParseStatusLenientTest, IgnoresFramesAfterTheLogprob) {
  auto message = ParseStatusLenient(Frames{"42", "5", "1", "100", "", "5", "", "junk", "\xff"});
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->cached_tokens, 5);
  EXPECT_EQ(message->bootstrap_logprob, std::nullopt);
}

TEST(ParseStatusLenientTest, AFailedStatusWithABadTrailerIsDroppedWhole) {
  ExpectLenientError(Frames{"42", "0", "1", "-1", "", "", ""}, "status frame 5 (cached tokens)");
}

TEST(BuildStatusTest, FailedWithoutTokenOrIds) {
  auto frames =
      BuildStatus({9223372036854775807ULL, 0, 3, -1, std::nullopt}, StatusForm::kSnapshot);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames, (Frames{"9223372036854775807", "0", "3", "-1", ""}));
}

TEST(BuildStatusTest, SuccessWithTokenAndLittleEndianIds) {
  auto frames = BuildStatus({42, 5, 1, 151643, std::vector<int32_t>{7, -1}}, StatusForm::kSnapshot);
  ASSERT_TRUE(frames.ok()) << frames.status();
  EXPECT_EQ(*frames,
            (Frames{"42", "5", "1", "151643", std::string("\x07\0\0\0\xff\xff\xff\xff", 8)}));
}

TEST(BuildStatusTest, EmptyIdListIsSentAsAnEmptyFrameAndReadsBackAsNone) {
  auto frames = BuildStatus({42, 5, 0, 9, std::vector<int32_t>{}}, StatusForm::kSnapshot);
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
    absl::Status status = BuildStatus(message, StatusForm::kSnapshot).status();
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

TEST(ParseStatusTest, RequiresFiveSixOrSevenFrames) {
  ExpectStrictError(Frames{"42", "5", "1"},
                    "status: got 3 frames, requires 5 (snapshot) or 6 or 7 (2026-09)");
  ExpectStrictError(Frames{"42", "5", "1", "-1"}, "got 4 frames");
  ExpectStrictError(Frames{"42", "5", "1", "-1", "", "0", "", ""}, "got 8 frames");
  EXPECT_TRUE(ParseStatus(Frames{"42", "5", "1", "-1", ""}).ok());
  EXPECT_TRUE(ParseStatus(Frames{"42", "5", "1", "-1", "", "0"}).ok());
  EXPECT_TRUE(ParseStatus(Frames{"42", "5", "1", "-1", "", "0", ""}).ok());
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

TEST(ParseStatusLenientTest, TokenAndIdsAreOptional) {
  EXPECT_EQ(*ParseStatusLenient(Frames{"42", "5", "1"}), (StatusMessage{42, 5, 1, -1, {}}));
  EXPECT_EQ(*ParseStatusLenient(Frames{"42", "5", "1", "7"}), (StatusMessage{42, 5, 1, 7, {}}));
}

// The snapshot ignored every frame after 4 (CACHEPD §3.4); 2026-09 reads frames 5 and 6
// (CACHEPD §12.9), so junk there now drops the message.
TEST(ParseStatusLenientTest, Frames5And6AreNoLongerIgnored) {
  ExpectLenientError(Frames{"42", "5", "1", "7", "", "junk"}, "status frame 5 (cached tokens)");
  ExpectLenientError(Frames{"42", "5", "1", "7", "", "0", "\xff"},
                     "status frame 6 (bootstrap logprob)");
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
