// Processes moving a 64 MiB patterned arena along planned head-sliced routes over real
// transports: UCX tcp on 127.0.0.1, UCX shared memory, and verbs over the software provider.
// Every TP pair the planner slices heads for (2:1, 1:2, 4:2, 2:4, 8:2), as strided copies (a
// page's rows as one copy, what a prefill sidecar sends by default), and the two smallest also as
// a copy per row (its --no-strided-copies). Every destination byte is verified and every other
// byte checked untouched (tests/transfer/harness.h).
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/transfer/harness.h"

namespace kvrail::testing {
namespace {

struct Case {
  const char* name;
  const char* tls;
  int prefill_tp;
  int decode_tp;
  bool strided_copies = true;
};

// 64 MiB arenas at TP 1 (a quarter of the fixture's), 112 of 127 pages in the room: every
// route's copies are the same in kind (head-sliced rows of every page of every field) as at the
// fixture's size, and a test's time goes with the bytes.
RouteSetup QuarterRoute() {
  RouteSetup setup;
  setup.shape.pages = 127;
  setup.room_pages = 112;
  return setup;
}

class TwoProcessTransferTest : public ::testing::TestWithParam<Case> {};

TEST_P(TwoProcessTransferTest, EveryPlannedByteLandsAndNothingElse) {
  const Case& c = GetParam();
  RouteSetup setup = QuarterRoute();
  setup.prefill_tp = c.prefill_tp;
  setup.decode_tp = c.decode_tp;
  setup.strided_copies = c.strided_copies;
  // The route is head-sliced, so prefill rank 0's copies into decode rank 0 are rows: strided
  // copies of several rows each, or a copy per row.
  absl::StatusOr<CopyList> copies = RoomCopies(setup, 0, 0);
  ASSERT_TRUE(copies.ok()) << copies.status();
  ASSERT_FALSE(copies->empty());
  for (const Copy& copy : *copies) {
    if (c.strided_copies) {
      EXPECT_GT(copy.rows, 1u);
    } else {
      EXPECT_EQ(copy.rows, 1u);
    }
  }
  HarnessOptions options;
  options.tls = c.tls;
  absl::StatusOr<HarnessResult> result = RunTransfer(setup, options);
  ASSERT_TRUE(result.ok()) << result.status();
  // 112 of 127 pages of 16 fields of 32 KiB at TP 1 land on the decode side(s) in total.
  EXPECT_EQ(result->bytes_verified, uint64_t{112} * 16 * 32768);
  EXPECT_GT(result->bytes_untouched, 0u);
  std::printf("%s: %.1f MiB verified, moved in %.3f s\n", c.name,
              result->bytes_verified / 1048576.0, result->seconds);
}

INSTANTIATE_TEST_SUITE_P(
    Routes, TwoProcessTransferTest,
    ::testing::Values(
        Case{"tcp_p2_d1", "tcp", 2, 1}, Case{"tcp_p1_d2", "tcp", 1, 2},
        Case{"tcp_p4_d2", "tcp", 4, 2}, Case{"tcp_p2_d4", "tcp", 2, 4},
        Case{"tcp_p8_d2", "tcp", 8, 2}, Case{"shm_p2_d1", "sm", 2, 1},
        Case{"shm_p1_d2", "sm", 1, 2}, Case{"shm_p4_d2", "sm", 4, 2}, Case{"shm_p2_d4", "sm", 2, 4},
        Case{"shm_p8_d2", "sm", 8, 2}, Case{"verbs_p2_d1", "verbs", 2, 1},
        Case{"verbs_p1_d2", "verbs", 1, 2}, Case{"verbs_p4_d2", "verbs", 4, 2},
        Case{"verbs_p2_d4", "verbs", 2, 4}, Case{"verbs_p8_d2", "verbs", 8, 2},
        Case{"tcp_p2_d1_rows", "tcp", 2, 1, false}, Case{"tcp_p1_d2_rows", "tcp", 1, 2, false},
        Case{"shm_p2_d1_rows", "sm", 2, 1, false}, Case{"shm_p1_d2_rows", "sm", 1, 2, false},
        Case{"verbs_p2_d1_rows", "verbs", 2, 1, false},
        Case{"verbs_p1_d2_rows", "verbs", 1, 2, false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvrail::testing

namespace kvrail::testing {
namespace {

TEST(TransferFaultTest, OutOfBoundsDestinationIsRejectedWithNothingWritten) {
  RouteSetup setup = QuarterRoute();  // every byte of the decode's 64 MiB is checked untouched
  setup.prefill_tp = 2;
  HarnessOptions options;
  options.prefill_args = {"--out-of-bounds"};
  options.expect_failure = true;
  absl::StatusOr<HarnessResult> result = RunTransfer(setup, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->failures.size(), 2u);
  for (const std::string& failure : result->failures) {
    EXPECT_NE(failure.find("INVALID_ARGUMENT"), std::string::npos) << failure;
    EXPECT_NE(failure.find("nothing was written"), std::string::npos) << failure;
  }
  EXPECT_EQ(result->bytes_untouched, uint64_t{64} << 20);
}

// A whole-page route (1:1) and a head-sliced one (2:1, strided copies): decode 0 is killed while
// every prefill's rooms are in flight.
class DecodeKilledTest : public ::testing::TestWithParam<int> {};

TEST_P(DecodeKilledTest, ADecodeKilledMidRoomFailsTheRoomsWithinTheirDeadline) {
  RouteSetup setup = QuarterRoute();
  setup.prefill_tp = GetParam();
  HarnessOptions options;
  // Forty rooms of 56 MiB (2.2 GiB) over tcp take far longer than the kill takes to land (it
  // lands within milliseconds of the prefill's "submitted"; the prefill failed 74-92 ms after it
  // in three runs).
  options.rooms = 40;
  options.prefill_args = {"--deadline-ms", "8000"};
  options.expect_failure = true;
  options.kill_decode_after_submit = true;
  absl::StatusOr<HarnessResult> result = RunTransfer(setup, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->failures.size(), static_cast<size_t>(setup.prefill_tp));
  for (const std::string& failure : result->failures) {
    EXPECT_TRUE(failure.find("UNAVAILABLE") != std::string::npos ||
                failure.find("DEADLINE_EXCEEDED") != std::string::npos ||
                failure.find("CANCELLED") != std::string::npos)
        << failure;
  }
  // Within the deadline (plus the time to notice), never a hang.
  EXPECT_LT(result->failure_latency, absl::Seconds(20));
  std::printf("killed decode: the prefills failed after %s: %s\n",
              absl::FormatDuration(result->failure_latency).c_str(), result->failures[0].c_str());
}

INSTANTIATE_TEST_SUITE_P(PrefillTp, DecodeKilledTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("p", info.param, "_d1"); });

}  // namespace
}  // namespace kvrail::testing
