#include "engine/base/error.h"

#include <gtest/gtest.h>

namespace kvrail {
namespace {

TEST(ErrorTest, CategoryRoundTripsThroughStatus) {
  absl::Status status = MakeError(ErrorCategory::kInvalidManifest, "frame 2: bad");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(CategoryOf(status).has_value());
  EXPECT_EQ(*CategoryOf(status), ErrorCategory::kInvalidManifest);
  EXPECT_EQ(DescribeError(status), "invalid-manifest: frame 2: bad");
}

TEST(ErrorTest, AddContextKeepsCategoryAndCode) {
  absl::Status status =
      AddContext(MakeError(ErrorCategory::kInvalidContract, "dtype unknown"), "frame 5");
  EXPECT_EQ(status.message(), "frame 5: dtype unknown");
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidContract);
  EXPECT_TRUE(AddContext(absl::OkStatus(), "x").ok());
}

// A peer's id with a newline in it (found by tests/fuzz:bootstrap_fuzz in a stage list) must not
// break a log line or a one-line answer in two.
TEST(ErrorTest, MessagesStayOnOneLine) {
  absl::Status status = MakeError(ErrorCategory::kUnsupportedLayout, "field 'a\nb\x7f\x01' é");
  EXPECT_EQ(status.message(), "field 'a\\x0ab\\x7f\\x01' é");
  status = AddContext(status, "stage\r\n");
  EXPECT_EQ(status.message(), "stage\\x0d\\x0a: field 'a\\x0ab\\x7f\\x01' é");
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kUnsupportedLayout);
}

TEST(ErrorTest, ForeignStatusHasNoCategory) {
  EXPECT_FALSE(CategoryOf(absl::InternalError("x")).has_value());
  EXPECT_EQ(DescribeError(absl::InternalError("x")), "error: x");
}

TEST(ErrorTest, NamesParseBack) {
  for (auto c : {ErrorCategory::kInvalidFrame, ErrorCategory::kInvalidContract,
                 ErrorCategory::kIncompatiblePeer, ErrorCategory::kInvalidManifest,
                 ErrorCategory::kUnsupportedLayout}) {
    EXPECT_EQ(CategoryFromName(CategoryName(c)), c);
  }
  EXPECT_FALSE(CategoryFromName("nope").has_value());
}

}  // namespace
}  // namespace kvrail
