#include "control/sidecar/room_transfers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvrail::sidecar {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

TEST(RoomTransfersTest, APreparedRoomPostsAndLandsWithItsLastOutcome) {
  RoomTransfers transfers;
  const uint64_t gen = transfers.Begin(1, 4096, /*final=*/true, kT0);
  EXPECT_EQ(transfers.Phase(1), TransferPhase::kPreparing);
  TransferActions actions;
  std::optional<std::vector<uint64_t>> ids =
      transfers.Prepared(1, gen, {"a:1", "b:2"}, kT0, actions);
  ASSERT_TRUE(ids.has_value());
  ASSERT_EQ(ids->size(), 2u);
  EXPECT_EQ(transfers.Phase(1), TransferPhase::kPosting);
  EXPECT_EQ(transfers.SessionOf((*ids)[1]), "b:2");
  EXPECT_THAT(transfers.Submitted(1).cancel, IsEmpty());
  EXPECT_FALSE(transfers.Outcome((*ids)[0], absl::OkStatus(), "", kT0, true, 3).ended.has_value());
  TransferActions last =
      transfers.Outcome((*ids)[1], absl::OkStatus(), "", kT0 + absl::Seconds(1), true, 5);
  ASSERT_TRUE(last.ended.has_value());
  EXPECT_TRUE(last.ended->landed);
  EXPECT_EQ(last.ended->bytes, 4096u);
  EXPECT_EQ(last.ended->copies, 8u);
  EXPECT_EQ(last.ended->elapsed, absl::Seconds(1));
  EXPECT_EQ(transfers.size(), 0u);
  EXPECT_EQ(transfers.transfers_in_flight(), 0u);
}

TEST(RoomTransfersTest, AFailureWhilePreparingEndsTheRoomAndTheLatePreparationSubmitsNothing) {
  RoomTransfers transfers;
  const uint64_t gen = transfers.Begin(1, 10, /*final=*/true, kT0);
  TransferActions failed = transfers.Fail(1, "the engine aborted", "", kT0);
  ASSERT_TRUE(failed.ended.has_value());
  EXPECT_FALSE(failed.ended->landed);
  EXPECT_EQ(failed.ended->reason, "the engine aborted");
  TransferActions late;
  EXPECT_FALSE(transfers.Prepared(1, gen, {"a:1"}, kT0, late).has_value());
  EXPECT_FALSE(late.ended.has_value()) << "a stale preparation ended the room twice";
  EXPECT_EQ(transfers.size(), 0u);
}

TEST(RoomTransfersTest, AFailureWhilePostingCancelsAndEndsOnlyWhenEveryTransferReported) {
  RoomTransfers transfers;
  const uint64_t gen = transfers.Begin(1, 10, /*final=*/true, kT0);
  TransferActions actions;
  std::vector<uint64_t> ids = *transfers.Prepared(1, gen, {"a:1", "b:2"}, kT0, actions);
  TransferActions failed = transfers.Fail(1, "the engine aborted", "", kT0);
  EXPECT_THAT(failed.cancel, ElementsAre(ids[0], ids[1]));
  EXPECT_FALSE(failed.ended.has_value()) << "Failed before the fence";
  // Cancelled while being submitted: the submitter cancels again.
  EXPECT_THAT(transfers.Submitted(1).cancel, ElementsAre(ids[0], ids[1]));
  EXPECT_FALSE(transfers.Outcome(ids[0], absl::CancelledError("x"), "", kT0).ended.has_value());
  TransferActions last = transfers.Outcome(ids[1], absl::OkStatus(), "", kT0);
  ASSERT_TRUE(last.ended.has_value());
  EXPECT_FALSE(last.ended->landed);
  EXPECT_EQ(last.ended->reason, "the engine aborted");
  EXPECT_EQ(last.ended->blame, "");
}

TEST(RoomTransfersTest, ATransportFailureFailsTheSiblingsAndBlamesItsSession) {
  RoomTransfers transfers;
  const uint64_t gen = transfers.Begin(1, 10, /*final=*/true, kT0);
  TransferActions actions;
  std::vector<uint64_t> ids = *transfers.Prepared(1, gen, {"a:1", "b:2"}, kT0, actions);
  TransferActions failed =
      transfers.Outcome(ids[0], absl::UnavailableError("peer gone"), "a:1", kT0);
  EXPECT_THAT(failed.cancel, ElementsAre(ids[1]));
  TransferActions last = transfers.Outcome(ids[1], absl::CancelledError("sibling"), "", kT0);
  ASSERT_TRUE(last.ended.has_value());
  EXPECT_FALSE(last.ended->landed);
  EXPECT_EQ(last.ended->blame, "a:1");
  EXPECT_NE(last.ended->reason.find("peer gone"), std::string::npos);
}

TEST(RoomTransfersTest, UnknownRoomsAndTransfersAreIgnored) {
  RoomTransfers transfers;
  EXPECT_FALSE(transfers.Fail(9, "x", "", kT0).ended.has_value());
  EXPECT_FALSE(transfers.Outcome(9, absl::OkStatus(), "", kT0).ended.has_value());
  EXPECT_THAT(transfers.Submitted(9).cancel, IsEmpty());
  EXPECT_EQ(transfers.SessionOf(9), "");
  EXPECT_FALSE(transfers.Phase(9).has_value());
}

TEST(RoomTransfersTest, ARoomWithNothingToMoveLandsWhenPrepared) {
  RoomTransfers transfers;
  const uint64_t gen = transfers.Begin(1, 0, /*final=*/true, kT0);
  TransferActions actions;
  EXPECT_FALSE(transfers.Prepared(1, gen, {}, kT0, actions).has_value());
  ASSERT_TRUE(actions.ended.has_value());
  EXPECT_TRUE(actions.ended->landed);
}

// Layer-wise streaming: a room's works land one by one, and the room ends only once its final
// work and every earlier one have landed; its bytes and copies are the works' sums.
TEST(RoomTransfersTest, ARoomOfSeveralWorksLandsWithItsFinalWorksLastOutcome) {
  RoomTransfers transfers;
  TransferActions actions;
  const uint64_t first = transfers.Begin(1, 100, /*final=*/false, kT0);
  std::vector<uint64_t> a = *transfers.Prepared(1, first, {"a:1"}, kT0, actions);
  EXPECT_FALSE(transfers.Outcome(a[0], absl::OkStatus(), "", kT0, true, 3).ended.has_value())
      << "landed before its final work";
  EXPECT_TRUE(transfers.Tracks(1));
  const uint64_t second = transfers.Begin(1, 50, /*final=*/false, kT0);
  const uint64_t last = transfers.Begin(1, 25, /*final=*/true, kT0);
  std::vector<uint64_t> c = *transfers.Prepared(1, last, {"a:1"}, kT0, actions);
  EXPECT_FALSE(transfers.Outcome(c[0], absl::OkStatus(), "", kT0, true, 1).ended.has_value())
      << "landed while an earlier work is still being prepared";
  std::vector<uint64_t> b = *transfers.Prepared(1, second, {"a:1"}, kT0, actions);
  TransferActions done =
      transfers.Outcome(b[0], absl::OkStatus(), "", kT0 + absl::Seconds(2), true, 2);
  ASSERT_TRUE(done.ended.has_value());
  EXPECT_TRUE(done.ended->landed);
  EXPECT_EQ(done.ended->bytes, 175u);
  EXPECT_EQ(done.ended->copies, 6u);
  EXPECT_EQ(done.ended->elapsed, absl::Seconds(2));
}

// Failed means fenced between works too: a failure with nothing in flight ends the room at
// once; with a work in flight, once it reported; a work prepared later submits nothing.
TEST(RoomTransfersTest, AFailureBetweenWorksEndsOnceNothingOfTheRoomIsInFlight) {
  RoomTransfers transfers;
  TransferActions actions;
  const uint64_t first = transfers.Begin(1, 100, /*final=*/false, kT0);
  std::vector<uint64_t> a = *transfers.Prepared(1, first, {"a:1"}, kT0, actions);
  ASSERT_FALSE(transfers.Outcome(a[0], absl::OkStatus(), "", kT0).ended.has_value());
  TransferActions idle = transfers.Fail(1, "the engine aborted", "", kT0);
  ASSERT_TRUE(idle.ended.has_value()) << "nothing in flight: fenced at once";
  EXPECT_FALSE(idle.ended->landed);

  const uint64_t one = transfers.Begin(2, 10, /*final=*/false, kT0);
  std::vector<uint64_t> x = *transfers.Prepared(2, one, {"a:1"}, kT0, actions);
  const uint64_t two = transfers.Begin(2, 10, /*final=*/false, kT0);
  TransferActions failed = transfers.Fail(2, "the engine aborted", "", kT0);
  EXPECT_THAT(failed.cancel, ElementsAre(x[0]));
  EXPECT_FALSE(failed.ended.has_value());
  TransferActions late;
  EXPECT_FALSE(transfers.Prepared(2, two, {"a:1"}, kT0, late).has_value());
  EXPECT_FALSE(late.ended.has_value()) << "ended while a transfer is in flight";
  TransferActions fenced = transfers.Outcome(x[0], absl::CancelledError("x"), "", kT0);
  ASSERT_TRUE(fenced.ended.has_value());
  EXPECT_FALSE(fenced.ended->landed);
  EXPECT_EQ(transfers.size(), 0u);
}

}  // namespace
}  // namespace kvrail::sidecar
