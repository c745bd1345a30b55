#include "control/session/failure_cause.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace kvrail::session {
namespace {

TEST(FailureCauseTest, EveryCauseHasItsOwnLabelFromTheFixedList) {
  const std::set<std::string> allowed = {
      "aborted", "timeout", "peer_failed", "expired", "handshake", "transport", "bounds",
      "invalid", "refused", "digest",      "engine",  "bootstrap", "other"};
  std::set<std::string> seen;
  for (int c = static_cast<int>(FailureCause::kAborted);
       c <= static_cast<int>(FailureCause::kOther); ++c) {
    const std::string label(FailureCauseLabel(static_cast<FailureCause>(c)));
    EXPECT_EQ(allowed.count(label), 1u) << label;
    EXPECT_TRUE(seen.insert(label).second) << label << " twice";
  }
  EXPECT_EQ(seen, allowed);
  EXPECT_EQ(FailureCauseLabel(FailureCause::kNone), "");
}

TEST(FailureCauseTest, AStatusGivesTheCauseOfItsCode) {
  EXPECT_EQ(FailureCauseOf(absl::OkStatus()), FailureCause::kNone);
  EXPECT_EQ(FailureCauseOf(absl::DeadlineExceededError("x")), FailureCause::kTimeout);
  EXPECT_EQ(FailureCauseOf(absl::OutOfRangeError("x")), FailureCause::kBounds);
  EXPECT_EQ(FailureCauseOf(absl::InvalidArgumentError("x")), FailureCause::kInvalid);
  EXPECT_EQ(FailureCauseOf(absl::PermissionDeniedError("x")), FailureCause::kRefused);
  EXPECT_EQ(FailureCauseOf(absl::FailedPreconditionError("x")), FailureCause::kRefused);
  EXPECT_EQ(FailureCauseOf(absl::UnavailableError("x")), FailureCause::kTransport);
  EXPECT_EQ(FailureCauseOf(absl::DataLossError("x")), FailureCause::kTransport);
  EXPECT_EQ(FailureCauseOf(absl::CancelledError("x")), FailureCause::kAborted);
  EXPECT_EQ(FailureCauseOf(absl::NotFoundError("x")), FailureCause::kOther);
}

}  // namespace
}  // namespace kvrail::session
