#include "control/wire/python_int.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();

absl::StatusOr<int64_t> Parse(const std::string& frame) {
  return ParsePythonInt(frame, kMin64, kMax64, "status frame 1 (status)");
}

void ExpectSyntaxError(const std::string& frame) {
  auto parsed = Parse(frame);
  ASSERT_FALSE(parsed.ok()) << "accepted \"" << frame << "\"";
  EXPECT_EQ(CategoryOf(parsed.status()), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("as Python int() reads it"));
}

// Expected values were checked against CPython 3.11, the reference's interpreter.
TEST(ParsePythonIntTest, AcceptsWhatPythonIntAccepts) {
  EXPECT_EQ(*Parse("42"), 42);
  EXPECT_EQ(*Parse(" 42 "), 42);
  EXPECT_EQ(*Parse("\t\n\v\f\r7\r\n"), 7);
  EXPECT_EQ(*Parse("+5"), 5);
  EXPECT_EQ(*Parse("-5"), -5);
  EXPECT_EQ(*Parse("-0"), 0);
  EXPECT_EQ(*Parse("007"), 7);
  EXPECT_EQ(*Parse("1_0"), 10);
  EXPECT_EQ(*Parse("0_0"), 0);
  EXPECT_EQ(*Parse("1_000_000"), 1000000);
  EXPECT_EQ(*Parse(" -1 "), -1);
}

TEST(ParsePythonIntTest, RejectsWhatPythonIntRejects) {
  for (const char* frame :
       {"", "  ", "+", "-", "0x5", "1__0", "_1", "1_", "+_1", "- 5", "1 2", "1.0", "1e3", "++1",
        "\0345"}) {  // \034 (\x1c) is str whitespace, but int() rejects it
    ExpectSyntaxError(frame);
  }
  ExpectSyntaxError(std::string("5\0", 2));
}

TEST(ParsePythonIntTest, RejectsNonAsciiLikeTheAsciiDecode) {
  auto parsed = Parse("\xd9\xa4\xd9\xa2");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "status frame 1 (status): byte 0xd9 at offset 0 is not ASCII (CACHEPD §3.4)");
}

TEST(ParsePythonIntTest, Int64Extremes) {
  EXPECT_EQ(*Parse("9223372036854775807"), kMax64);
  EXPECT_EQ(*Parse("-9223372036854775808"), kMin64);
  EXPECT_EQ(*Parse("0009_223_372_036_854_775_807"), kMax64);
}

TEST(ParsePythonIntTest, ValuesBeyondInt64AreOutOfRange) {
  for (const char* frame : {"9223372036854775808", "-9223372036854775809", "1180591620717411303424",
                            "99999999999999999999999999999999"}) {
    auto parsed = Parse(frame);
    ASSERT_FALSE(parsed.ok()) << frame;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("is out of range"));
  }
}

TEST(ParsePythonIntTest, RangeMessageShowsTheNormalisedValue) {
  auto parsed = ParsePythonInt(" +0001_180591620717411303424 ", 0, kMax64, "status frame 0 (room)");
  EXPECT_EQ(parsed.status().message(),
            "status frame 0 (room): 1180591620717411303424 is out of range "
            "[0, 9223372036854775807] (CACHEPD §3.4)");
  auto negative = ParsePythonInt("-0_3", 0, 10, "status frame 2 (prefill rank)");
  EXPECT_EQ(negative.status().message(),
            "status frame 2 (prefill rank): -3 is out of range [0, 10] (CACHEPD §3.4)");
}

TEST(ParsePythonIntTest, AppliesTheCallersBounds) {
  EXPECT_EQ(*ParsePythonInt("-0", 0, 10, "x"), 0);
  EXPECT_FALSE(ParsePythonInt("-1", 0, 10, "x").ok());
  EXPECT_FALSE(ParsePythonInt("11", 0, 10, "x").ok());
  EXPECT_EQ(*ParsePythonInt("10", 0, 10, "x"), 10);
}

}  // namespace
}  // namespace kvrail::wire
