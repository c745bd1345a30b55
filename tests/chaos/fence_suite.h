// Failed means fenced, proven on real processes: a prefill and a decode sidecar over UCX tcp,
// shared memory, or tcp between two network namespaces (fence_test, netns_test instantiate
// the suite), the test as both engines, an abort at each point of a room's life, and a
// watcher on every byte of the decode's pages. Once the decode engine is told its pages are
// free (a Failed event with PAGES_REUSABLE, or the release after PAGES_HELD), none of them may
// change again: a late write there would corrupt the next request's cache (SGLang #32564).
#ifndef KVRAIL_TESTS_CHAOS_FENCE_SUITE_H_
#define KVRAIL_TESTS_CHAOS_FENCE_SUITE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/netns.h"
#include "tests/chaos/deployment.h"
#include "tests/support/byte_count.h"

namespace kvrail::chaos {

// Runs the prefill node (bootstrap, prefill sidecar) in `pair`'s initiator namespace and the
// decodes in its target, over UCX tcp on the veth pair (or `tls` "verbs": the verbs backend, its
// software rails on the veth ends).
inline void PlaceInNamespaces(const cluster::NetnsPair& pair, DeploymentOptions& options,
                              const std::string& tls = "tcp") {
  options.tls = tls;
  options.prefill_prefix = cluster::NetnsPair::ExecPrefix(pair.initiator().netns);
  options.decode_prefix = cluster::NetnsPair::ExecPrefix(pair.target().netns);
  options.prefill_host = pair.initiator().address;
  options.decode_host = pair.target().address;
  options.net_devices = pair.initiator().device;
  options.decode_net_devices = pair.target().device;
}

// The parameter: "tcp" or "sm" (UCX on the host's loopback), "verbs" (the verbs backend over the
// software provider, rail on lo), or "netns" / "netns_verbs" (UCX tcp / verbs between two
// network namespaces; root only).
inline constexpr int64_t kRoomBlocks = 128;  // 256 MiB
// How long the watcher keeps looking after the pages were freed: far longer than any write
// of the room takes to land here (the whole room moves in well under a second).
inline const absl::Duration kWatch = absl::Milliseconds(700);
// What the decode's pages hold before a room, and what the engine writes into them the moment
// it is told they are free (the next request's KV).
inline constexpr uint8_t kBefore = 0xB7;
inline constexpr uint8_t kNextRequest = 0x5A;
inline constexpr size_t kSampleStride = 4096;

struct Trial {
  bool failed = false;        // the room failed (the abort came before it landed)
  uint64_t landed_bytes = 0;  // bytes of the decode's pages written when they were freed
  uint64_t after_free = 0;    // bytes changed after that: must be 0
  bool proven = false;        // the release (or the Failed) proved the fence
  std::string reason;
};

class FenceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    DeploymentOptions options;
    options.pages = kRoomBlocks + 1;
    const std::string param = GetParam();
    if (param == "netns" || param == "netns_verbs") {
      // The prefill node in one namespace, the decode in another, over a veth pair.
      ASSERT_EQ(geteuid(), 0u) << "needs root (network namespaces); CI runs it as root";
      absl::StatusOr<cluster::NetnsPair> pair = cluster::NetnsPair::Create();
      ASSERT_TRUE(pair.ok()) << pair.status();
      netns_ = std::make_unique<cluster::NetnsPair>(*std::move(pair));
      PlaceInNamespaces(*netns_, options, param == "netns" ? "tcp" : "verbs");
    } else {
      options.tls = param;
    }
    auto started = Deployment::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    deployment_ = *std::move(started);
  }

  // One room of kRoomBlocks blocks, aborted by `who` `delay` after the prefill's Ready.
  Trial Run(uint64_t room, Rank& who, absl::Duration delay) {
    Deployment& d = *deployment_;
    Trial trial;
    const layout::Manifest manifest = d.Blocks(1, kRoomBlocks);
    Arena& pages = *d.decode(0).arena;
    std::memset(pages.data(), kBefore, pages.size());
    EXPECT_TRUE(d.Expect(0, room, manifest).ok());
    EXPECT_TRUE(d.Ready(room, manifest).ok());
    absl::SleepFor(delay);
    EXPECT_TRUE(d.Abort(who, room, "the client went away").ok());
    absl::StatusOr<v1::RoomEvent> freed = d.PagesFree(0, room, absl::Seconds(30));
    // The engine reuses the pages at once: the next request's KV goes in. A late write of the
    // failed room would overwrite some of it.
    // What had landed, from one byte in every 4 KiB: a full copy first would leave the late
    // writes time to land before the next request's bytes go in, and hide them.
    uint64_t sampled = 0;
    for (size_t i = 0; i < pages.size(); i += kSampleStride) sampled += pages.data()[i] != kBefore;
    std::memset(pages.data(), kNextRequest, pages.size());
    trial.landed_bytes = sampled * kSampleStride;
    absl::SleepFor(kWatch);
    trial.after_free = kvrail::testing::CountBytesNot(pages.data(), pages.size(), kNextRequest);
    absl::StatusOr<v1::RoomEvent> prefill_event = d.Event(d.prefill(), room, absl::Seconds(30));
    EXPECT_TRUE(prefill_event.ok()) << prefill_event.status();
    if (prefill_event.ok()) {
      trial.failed = prefill_event->status() == v1::TRANSFER_POLL_FAILED;
      EXPECT_EQ(prefill_event->pages(), v1::PAGES_REUSABLE);
    }
    if (!freed.ok()) {
      // The abort came too late: the room landed whole, and Success is the right answer.
      EXPECT_FALSE(trial.failed) << freed.status();
      return trial;
    }
    trial.proven = freed->pages_proven() || !freed->pages_released();
    trial.reason = freed->reason();
    std::printf(
        "[%s] %s abort after %s: room failed=%d, about %.0f MiB of %.0f MiB landed when the pages "
        "were freed (%s), %llu bytes of the next request overwritten after\n",
        GetParam(), who.name.c_str(), absl::FormatDuration(delay).c_str(), trial.failed,
        trial.landed_bytes / 1048576.0, kRoomBlocks * kBlockBytes / 1048576.0,
        freed->pages_released() ? "released after the fence" : "Failed, reusable",
        static_cast<unsigned long long>(trial.after_free));
    return trial;
  }

  void ExpectEveryAbortFenced(Rank& who);

  void ExpectTheSidecarsServeOn(uint64_t room) {
    Deployment& d = *deployment_;
    const layout::Manifest manifest = d.Blocks(1, kRoomBlocks);
    ASSERT_TRUE(d.Expect(0, room, manifest).ok());
    ASSERT_TRUE(d.Ready(room, manifest).ok());
    absl::StatusOr<v1::RoomEvent> done = d.Event(d.decode(0), room, absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->status(), v1::TRANSFER_POLL_SUCCESS) << done->reason();
    EXPECT_TRUE(d.Landed(0, manifest));
  }

  std::unique_ptr<cluster::NetnsPair> netns_;  // outlives the deployment in it
  std::unique_ptr<Deployment> deployment_;
};

}  // namespace kvrail::chaos

#endif  // KVRAIL_TESTS_CHAOS_FENCE_SUITE_H_
