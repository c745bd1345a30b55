#include "control/wire/frame_text.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

TEST(IsAsciiTest, EveryByteBelow0x80) {
  EXPECT_TRUE(IsAscii(""));
  EXPECT_TRUE(IsAscii(std::string("a\0\x7f", 3)));
  EXPECT_FALSE(IsAscii("a\x80"));
  EXPECT_FALSE(IsAscii("\xff"));
}

TEST(RequireAsciiTest, NamesTheFirstOffendingByte) {
  EXPECT_TRUE(RequireAscii("10.0.0.2", "f", "§3.2").ok());
  absl::Status status = RequireAscii("ab\xc3\xa9", "registration frame 1 (endpoint)", "§3.2");
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidFrame);
  EXPECT_EQ(status.message(),
            "registration frame 1 (endpoint): byte 0xc3 at offset 2 is not ASCII (CACHEPD §3.2)");
}

TEST(QuoteFrameTest, EscapesAndShortensToOneLine) {
  EXPECT_EQ(QuoteFrame("080"), "\"080\"");
  EXPECT_EQ(QuoteFrame(std::string("\n\0\xff", 3)), "\"\\n\\x00\\xff\"");
  EXPECT_EQ(QuoteFrame(std::string(40, 'a')), "\"" + std::string(32, 'a') + "\"... (40 bytes)");
}

}  // namespace
}  // namespace kvrail::wire
