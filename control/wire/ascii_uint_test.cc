#include "control/wire/ascii_uint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

void ExpectNotCanonical(const std::string& frame, uint64_t min, uint64_t max) {
  auto parsed = ParseCanonicalUint(frame, min, max, "test frame");
  ASSERT_FALSE(parsed.ok()) << "accepted \"" << frame << "\"";
  EXPECT_EQ(CategoryOf(parsed.status()), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(parsed.status().message()),
              HasSubstr("must be canonical unsigned ASCII"));
}

void ExpectOutOfRange(const std::string& frame, uint64_t min, uint64_t max) {
  auto parsed = ParseCanonicalUint(frame, min, max, "test frame");
  ASSERT_FALSE(parsed.ok()) << "accepted \"" << frame << "\"";
  EXPECT_EQ(CategoryOf(parsed.status()), ErrorCategory::kInvalidFrame);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("is out of range"));
}

TEST(ParseCanonicalUintTest, AcceptsBoundsAndValuesBetween) {
  EXPECT_EQ(*ParseCanonicalUint("1", 1, 65535, "port"), 1u);
  EXPECT_EQ(*ParseCanonicalUint("65535", 1, 65535, "port"), 65535u);
  EXPECT_EQ(*ParseCanonicalUint("17001", 1, 65535, "port"), 17001u);
  EXPECT_EQ(*ParseCanonicalUint("0", 0, 5, "status"), 0u);
  EXPECT_EQ(*ParseCanonicalUint("9223372036854775807", 0, 9223372036854775807ULL, "room"),
            9223372036854775807ULL);
  EXPECT_EQ(*ParseCanonicalUint("18446744073709551615", 0, kMax64, "u64"), kMax64);
}

TEST(ParseCanonicalUintTest, ZeroIsCanonicalOnlyAsOneByte) {
  EXPECT_EQ(*ParseCanonicalUint("0", 0, 100, "x"), 0u);
  ExpectNotCanonical("00", 0, 100);
  ExpectNotCanonical("080", 0, 100);
}

TEST(ParseCanonicalUintTest, RejectsSignsSpacesPrefixesAndSeparators) {
  for (const char* frame : {"+1", "-1", " 1", "1 ", "0x5", "1_0", "1.0", "1e2", "\t1", "a"}) {
    ExpectNotCanonical(frame, 0, 100);
  }
  ExpectNotCanonical(std::string("1\0", 2), 0, 100);
  ExpectNotCanonical("\xd9\xa1", 0, 100);  // ARABIC-INDIC DIGIT ONE: not an ASCII digit
}

TEST(ParseCanonicalUintTest, RejectsEmptyFrame) { ExpectNotCanonical("", 0, 100); }

TEST(ParseCanonicalUintTest, LengthLimitComesFromTheDigitsOfMax) {
  ExpectNotCanonical("100000", 1, 65535);  // six digits: canonical error, not a range error
  ExpectOutOfRange("99999", 1, 65535);
  ExpectNotCanonical("10", 0, 5);
  ExpectNotCanonical("11111111111111111111", 0, 9223372036854775807ULL);  // 20 digits
}

TEST(ParseCanonicalUintTest, RangeErrorsBelowAndAbove) {
  ExpectOutOfRange("0", 1, 65535);
  ExpectOutOfRange("65536", 1, 65535);
  ExpectOutOfRange("6", 0, 5);
  ExpectOutOfRange("2", 0, 1);
  ExpectOutOfRange("9223372036854775808", 0, 9223372036854775807ULL);
}

TEST(ParseCanonicalUintTest, TwentyDigitsBeyondUint64AreOutOfRange) {
  ExpectOutOfRange("18446744073709551616", 0, kMax64);
  ExpectOutOfRange("99999999999999999999", 0, kMax64);
}

TEST(ParseCanonicalUintTest, CanonicalMessageNamesFrameValueRuleAndSection) {
  auto parsed = ParseCanonicalUint("080", 1, 65535, "registration frame 2 (port)");
  EXPECT_EQ(parsed.status().message(),
            "registration frame 2 (port): \"080\" must be canonical unsigned ASCII: 1 to 5 "
            "decimal digits, no sign, space or leading zero (CACHEPD §3.1)");
}

TEST(ParseCanonicalUintTest, RangeMessageNamesFrameValueBoundsAndSection) {
  auto parsed = ParseCanonicalUint("65536", 1, 65535, "registration frame 2 (port)");
  EXPECT_EQ(parsed.status().message(),
            "registration frame 2 (port): 65536 is out of range [1, 65535] (CACHEPD §3.1)");
}

TEST(ParseCanonicalUintTest, MessagesEscapeControlBytes) {
  auto parsed = ParseCanonicalUint("1\n", 0, 100, "f");
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("\"1\\n\""));
  EXPECT_EQ(parsed.status().message().find('\n'), absl::string_view::npos);
}

TEST(FormatUintTest, WritesCanonicalDecimal) {
  EXPECT_EQ(FormatUint(0), "0");
  EXPECT_EQ(FormatUint(17001), "17001");
  EXPECT_EQ(FormatUint(kMax64), "18446744073709551615");
}

TEST(FormatUintTest, ParsesBack) {
  for (uint64_t value : {uint64_t{0}, uint64_t{1}, uint64_t{10}, uint64_t{1} << 63, kMax64}) {
    EXPECT_EQ(*ParseCanonicalUint(FormatUint(value), 0, kMax64, "x"), value);
  }
}

}  // namespace
}  // namespace kvrail::wire
