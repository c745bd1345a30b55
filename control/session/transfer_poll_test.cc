// CACHEPD §7.1: the TransferPoll codes and update_status, exhaustively and over random
// sequences.
#include "control/session/transfer_poll.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <vector>

namespace kvrail::session {
namespace {

std::vector<TransferPoll> AllPolls() {
  std::vector<TransferPoll> polls;
  for (int code = 0; code <= 5; ++code) polls.push_back(*TransferPollFromCode(code));
  return polls;
}

TEST(TransferPollTest, CodesAreTheReferenceValues) {
  EXPECT_EQ(TransferPollCode(TransferPoll::kFailed), 0);
  EXPECT_EQ(TransferPollCode(TransferPoll::kBootstrapping), 1);
  EXPECT_EQ(TransferPollCode(TransferPoll::kBootstrapped), 2);
  EXPECT_EQ(TransferPollCode(TransferPoll::kWaitingForInput), 3);
  EXPECT_EQ(TransferPollCode(TransferPoll::kTransferring), 4);
  EXPECT_EQ(TransferPollCode(TransferPoll::kSuccess), 5);
  EXPECT_EQ(TransferPollFromCode(-1), std::nullopt);
  EXPECT_EQ(TransferPollFromCode(6), std::nullopt);
  EXPECT_EQ(TransferPollName(TransferPoll::kWaitingForInput), "WaitingForInput");
}

TEST(TransferPollTest, AFirstUpdateSetsAnyValue) {
  for (TransferPoll update : AllPolls()) {
    EXPECT_EQ(UpdateTransferPoll(std::nullopt, update), update);
  }
}

TEST(TransferPollTest, FailedIsStickyFromEitherSide) {
  for (TransferPoll other : AllPolls()) {
    EXPECT_EQ(UpdateTransferPoll(TransferPoll::kFailed, other), TransferPoll::kFailed);
    EXPECT_EQ(UpdateTransferPoll(other, TransferPoll::kFailed), TransferPoll::kFailed);
  }
}

TEST(TransferPollTest, OtherwiseTheMaximumWins) {
  for (TransferPoll current : AllPolls()) {
    for (TransferPoll update : AllPolls()) {
      if (current == TransferPoll::kFailed || update == TransferPoll::kFailed) continue;
      EXPECT_EQ(UpdateTransferPoll(current, update), std::max(current, update));
    }
  }
}

// Properties over random update sequences: once set, a state never decreases unless it turns
// Failed, and once Failed it stays Failed; the result is Failed exactly when some update was,
// and otherwise the maximum of the updates.
TEST(TransferPollTest, RandomSequencesAreForwardOnlyAndStickyFailed) {
  std::mt19937 random(20240601);
  std::uniform_int_distribution<int> code(0, 5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::optional<TransferPoll> state;
    bool saw_failed = false;
    TransferPoll highest = TransferPoll::kFailed;
    const int length = 1 + trial % 12;
    for (int i = 0; i < length; ++i) {
      const TransferPoll update = *TransferPollFromCode(code(random));
      const std::optional<TransferPoll> before = state;
      state = UpdateTransferPoll(state, update);
      saw_failed = saw_failed || update == TransferPoll::kFailed;
      highest = std::max(highest, update);
      if (before.has_value()) {
        if (*before == TransferPoll::kFailed) {
          EXPECT_EQ(*state, TransferPoll::kFailed);
        } else if (*state != TransferPoll::kFailed) {
          EXPECT_GE(*state, *before);
        }
      }
    }
    EXPECT_EQ(*state == TransferPoll::kFailed, saw_failed);
    if (!saw_failed) {
      EXPECT_EQ(*state, highest);
    }
  }
}

}  // namespace
}  // namespace kvrail::session
