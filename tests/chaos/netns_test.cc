// Two hosts on one machine (root only): the prefill node (bootstrap and prefill sidecar) in one
// network namespace, the decode sidecar in another, joined by a veth pair, over UCX tcp. The
// link is set down in the middle of a room and up again: the room fails on the prefill within
// its deadline plus the fence bound, the decode hears Failed once the link is back and is told
// its pages are free only as far as the fence could prove, and a new room lands over the healed
// link. The fence suite (fence_suite.h) runs here too, over the veth pair.
#include "bench/raw/netns.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/chaos/deployment.h"
#include "tests/chaos/fence_suite.h"

namespace kvrail::chaos {
namespace {

int Sh(const std::string& command) { return std::system(command.c_str()); }

TEST(NetnsFaultTest, ALinkDownMidRoomFailsItWithinTheDeadlineAndANewRoomLandsOnceItIsUp) {
  ASSERT_EQ(geteuid(), 0u) << "needs root (network namespaces); CI runs it as root";
  absl::StatusOr<bench::NetnsPair> pair = bench::NetnsPair::Create();
  ASSERT_TRUE(pair.ok()) << pair.status();
  DeploymentOptions options;
  options.pages = 129;
  PlaceInNamespaces(*pair, options);
  options.prefill_args = {"--transfer-deadline",  "2", "--fence-timeout", "1",
                          "--heartbeat-interval", "2"};
  // Generous on the decode: the link is down for a while, and the bootstrap's heartbeat must
  // not declare the prefill dead meanwhile.
  options.decode_args = {"--heartbeat-interval", "5", "--heartbeat-failures", "5",
                         "--fence-wait",         "10"};
  auto started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  const std::string link_down =
      absl::StrCat("ip -n ", pair->target().netns, " link set ", pair->target().device, " down");
  const std::string link_up =
      absl::StrCat("ip -n ", pair->target().netns, " link set ", pair->target().device, " up");
  const layout::Manifest manifest = d.Blocks(1, 128);
  Arena& pages = *d.decode(0).arena;
  ASSERT_TRUE(d.Expect(0, 1, manifest).ok());
  ASSERT_TRUE(d.Ready(1, manifest).ok());
  absl::SleepFor(absl::Milliseconds(30));
  ASSERT_EQ(Sh(link_down), 0);
  const absl::Time down = absl::Now();
  absl::StatusOr<v1::RoomEvent> failed = d.Event(d.prefill(), 1, absl::Seconds(30));
  ASSERT_TRUE(failed.ok()) << failed.status();
  const absl::Duration took = absl::Now() - down;
  if (failed->status() == v1::TRANSFER_POLL_SUCCESS) {
    Sh(link_up);
    GTEST_SKIP() << "the room landed before the link went down";
  }
  EXPECT_LT(took, absl::Seconds(2 + 1 + 3)) << failed->reason();
  std::printf("link down mid-room: prefill room failed after %s: %s\n",
              absl::FormatDuration(took).c_str(), failed->reason().c_str());
  absl::SleepFor(absl::Seconds(1));
  ASSERT_EQ(Sh(link_up), 0);
  absl::StatusOr<v1::RoomEvent> freed = d.PagesFree(0, 1, absl::Seconds(60));
  ASSERT_TRUE(freed.ok()) << freed.status();
  std::memset(pages.data(), 0x5A, pages.size());
  absl::SleepFor(absl::Milliseconds(700));
  uint64_t overwritten = 0;
  for (size_t i = 0; i < pages.size(); ++i) overwritten += pages.data()[i] != 0x5A;
  std::printf(
      "link up: decode pages freed %s after it came back (%s: %s), %llu bytes "
      "overwritten after\n",
      absl::FormatDuration(absl::Now() - down).c_str(),
      freed->pages_proven() ? "proven" : "unproven", freed->reason().c_str(),
      static_cast<unsigned long long>(overwritten));
  if (freed->pages_proven()) {
    EXPECT_EQ(overwritten, 0u);
  }
  // The link is back: a new room lands (the old session is quarantined for a while, CACHEPD
  // §7.4, so a restarted decode takes it).
  ASSERT_TRUE(d.RestartDecode(0).ok());
  const layout::Manifest small = d.Blocks(1, 8);
  ASSERT_TRUE(d.Expect(0, 2, small).ok());
  ASSERT_TRUE(d.Ready(2, small).ok());
  absl::StatusOr<v1::RoomEvent> done = d.Event(d.decode(0), 2, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
  EXPECT_TRUE(d.Landed(0, small));
}

// Failed means fenced between two hosts too: the fence suite over the veth pair.
INSTANTIATE_TEST_SUITE_P(Netns, FenceTest, ::testing::Values("netns"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvrail::chaos
