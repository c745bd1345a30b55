#include "control/session/room_transitions.h"

#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvrail::session {
namespace {

using P = TransferPoll;

const std::vector<std::optional<P>> kFrom = {
    std::nullopt,        P::kFailed,       P::kBootstrapping, P::kBootstrapped,
    P::kWaitingForInput, P::kTransferring, P::kSuccess};
const std::vector<P> kUpdates = {P::kFailed,          P::kBootstrapping, P::kBootstrapped,
                                 P::kWaitingForInput, P::kTransferring,  P::kSuccess};

bool Terminal(std::optional<P> state) { return state == P::kFailed || state == P::kSuccess; }

// Each table row is a move of CACHEPD §7.1's rule, and none leaves a terminal state.
TEST(RoomTransitionsTest, EveryListedMoveIsOneTheUpdateRuleMakes) {
  for (LedgerRole role : {LedgerRole::kPrefill, LedgerRole::kDecode}) {
    for (const RoomTransition& t : RoomTransitions(role)) {
      EXPECT_FALSE(Terminal(t.from)) << t.on;
      EXPECT_NE(t.from, std::optional<P>(t.to)) << t.on;
      EXPECT_EQ(UpdateTransferPoll(t.from, t.to), t.to) << t.on;
      EXPECT_FALSE(t.on.empty());
    }
  }
}

// Whatever the update, a room moves only along its role's table: a terminal room never moves,
// a prefill room is never WaitingForInput or Transferring, and Failed is reachable from every
// state that is not terminal.
TEST(RoomTransitionsTest, NextRoomStateFollowsTheTableAndNothingElse) {
  for (LedgerRole role : {LedgerRole::kPrefill, LedgerRole::kDecode}) {
    std::set<std::pair<std::optional<P>, P>> listed;
    for (const RoomTransition& t : RoomTransitions(role)) listed.insert({t.from, t.to});
    for (const std::optional<P>& from : kFrom) {
      for (P update : kUpdates) {
        bool unlisted = true;
        const std::optional<P> next = NextRoomState(role, from, update, &unlisted);
        const P rule = UpdateTransferPoll(from, update);
        if (rule == from) {
          EXPECT_FALSE(next.has_value());
          EXPECT_FALSE(unlisted);
        } else if (listed.count({from, rule}) > 0) {
          EXPECT_EQ(next, rule);
          EXPECT_FALSE(unlisted);
        } else {
          EXPECT_FALSE(next.has_value());
          EXPECT_TRUE(unlisted);
        }
        if (Terminal(from)) EXPECT_FALSE(next.has_value());
        if (role == LedgerRole::kPrefill && next.has_value()) {
          EXPECT_NE(*next, P::kWaitingForInput);
          EXPECT_NE(*next, P::kTransferring);
        }
      }
    }
  }
  for (const std::optional<P>& from : kFrom) {
    if (Terminal(from)) continue;
    bool unlisted = false;
    if (from != P::kWaitingForInput && from != P::kTransferring) {
      EXPECT_EQ(NextRoomState(LedgerRole::kPrefill, from, P::kFailed, &unlisted), P::kFailed);
    }
    if (from.has_value()) {
      EXPECT_EQ(NextRoomState(LedgerRole::kDecode, from, P::kFailed, &unlisted), P::kFailed);
    }
  }
}

// A decode's Success needs its pre-allocations sent: from Bootstrapping or Bootstrapped, a
// Success is not a move its table lists.
TEST(RoomTransitionsTest, ADecodeSucceedsOnlyAfterItsPreallocationsWentOut) {
  bool unlisted = false;
  EXPECT_FALSE(
      NextRoomState(LedgerRole::kDecode, P::kBootstrapped, P::kSuccess, &unlisted).has_value());
  EXPECT_TRUE(unlisted);
  EXPECT_EQ(NextRoomState(LedgerRole::kDecode, P::kWaitingForInput, P::kSuccess, &unlisted),
            P::kSuccess);
  EXPECT_FALSE(unlisted);
}

}  // namespace
}  // namespace kvrail::session
