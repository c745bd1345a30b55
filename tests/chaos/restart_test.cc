// Nothing left behind: decodes that crash and come back, over and over, against one prefill
// sidecar. Each restart brings a new session id (a new registration, a new data-plane link, a
// new PUSH route); the prefill must drop the old ones once it sees them gone, so that after
// many restarts its memory, its open files and every table are where they were after the
// first few.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/base/sanitizers.h"
#include "engine/transport/handshake/handshake.h"
#include "tests/chaos/deployment.h"
#include "tests/support/silent_listener.h"

namespace kvrail::chaos {
namespace {

// 200 in a plain build, whose resident-set check needs them (below). Under ASan or TSan that
// check is off, and the fds and tables, compared exactly, show a leaked session after any
// number of restarts: 40 (10 of warm-up) then, a fifth of the test command's time.
int Restarts() {
  int restarts = KVRAIL_ASAN || KVRAIL_TSAN ? 40 : 200;
  const char* env = std::getenv("KVRAIL_CHAOS_RESTARTS");
  if (env != nullptr) (void)absl::SimpleAtoi(env, &restarts);
  return restarts;
}

// Runs one small room to the (restarted) decode; it must land.
void OneRoom(Deployment& d, uint64_t room) {
  const absl::Status moved = d.MoveRoom(0, room, d.Blocks(1, 2));
  ASSERT_TRUE(moved.ok()) << moved;
}

// Waits until the prefill has dropped every session but the live one.
v1::SidecarStats Settled(Deployment& d) {
  v1::SidecarStats stats;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    stats = d.Stats(d.prefill()).value();
    if (stats.registrations() <= 1 && stats.data_plane_peers() <= 1 &&
        stats.scheduler_peers() <= 1 && stats.outbox_peers() <= 1) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return stats;
}

TEST(RestartTest, DecodesRestartingLeaveThePrefillWhereItWas) {
  DeploymentOptions options;
  options.pages = 4;
  // A restarted decode can bind a port that an earlier one's session named: the prefill tells
  // the stranger by its session key, or drops the session after --registration-ttl of silence.
  options.prefill_args = {"--heartbeat-interval", "2", "--registration-ttl", "5"};
  if (const char* arenas = std::getenv("KVRAIL_CHAOS_MALLOC_ARENA_MAX")) {
    options.prefill_env["MALLOC_ARENA_MAX"] = arenas;
  }
  auto started = Deployment::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Deployment& d = **started;
  const int restarts = Restarts();
  // The baseline is taken after a warm-up of a quarter of the restarts: by then glibc's
  // per-thread arenas and UCX's pools have grown to their working size (in CI the resident set
  // after one restart was 30.8 MB, and 33.5-36.1 MB at every later sample of a run that leaked
  // nothing). Against it the RSS check below catches a leak of more than about 20 kB per
  // restart (10 % of the baseline over the 150 restarts that follow); the fds and tables,
  // compared exactly, catch a leaked session of any size.
  const int warmup = std::max(1, restarts / 4);
  uint64_t room = 1;
  v1::SidecarStats first;
  uint64_t rss_first = 0;
  uint64_t fds_first = 0;
  absl::Time start;
  for (int i = 0; i < restarts; ++i) {
    ASSERT_TRUE(d.RestartDecode(0).ok()) << "restart " << i;
    OneRoom(d, room++);
    if (HasFatalFailure()) return;
    if (i + 1 == warmup) {
      first = Settled(d);
      std::tie(rss_first, fds_first) = Deployment::RssAndFds(d.prefill().sidecar->pid()).value();
      std::printf("after %d warm-up restarts: prefill RSS %llu kB, %llu fds\n", warmup,
                  (unsigned long long)rss_first, (unsigned long long)fds_first);
      start = absl::Now();
    } else if (i >= warmup && i % 50 == 0) {
      const auto [rss, fds] = Deployment::RssAndFds(d.prefill().sidecar->pid()).value();
      std::printf("%d restarts, %s: prefill RSS %llu kB, %llu fds\n", i,
                  absl::FormatDuration(absl::Now() - start).c_str(), (unsigned long long)rss,
                  (unsigned long long)fds);
    }
  }
  const v1::SidecarStats last = Settled(d);
  // The fds counted at one instant may hold one a probe or a handshake has open just then (one
  // run under ASan counted 52 against 51, and 51 on three reruns): a leaked fd stays, so the
  // count is taken again for up to 5 s until it is back at the baseline.
  uint64_t rss_last = 0;
  uint64_t fds_last = 0;
  const absl::Time patience = absl::Now() + absl::Seconds(5);
  while (true) {
    std::tie(rss_last, fds_last) = Deployment::RssAndFds(d.prefill().sidecar->pid()).value();
    if (fds_last <= fds_first || absl::Now() >= patience) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::printf(
      "after %d decode restarts: prefill RSS %llu kB -> %llu kB (%+.1f%%), fds %llu -> %llu, "
      "registrations %llu -> %llu, data-plane peers %llu -> %llu, scheduler peers %llu -> "
      "%llu, PUSH routes %llu -> %llu, rooms %llu -> %llu, strands %llu -> %llu\n",
      restarts, (unsigned long long)rss_first, (unsigned long long)rss_last,
      100.0 * (double(rss_last) - double(rss_first)) / double(rss_first),
      (unsigned long long)fds_first, (unsigned long long)fds_last,
      (unsigned long long)first.registrations(), (unsigned long long)last.registrations(),
      (unsigned long long)first.data_plane_peers(), (unsigned long long)last.data_plane_peers(),
      (unsigned long long)first.scheduler_peers(), (unsigned long long)last.scheduler_peers(),
      (unsigned long long)first.outbox_peers(), (unsigned long long)last.outbox_peers(),
      (unsigned long long)first.rooms(), (unsigned long long)last.rooms(),
      (unsigned long long)first.strands(), (unsigned long long)last.strands());
#if KVRAIL_ASAN || KVRAIL_TSAN
  // Under ASan (freed memory waits in its quarantine, 256 MB by default) and TSan the sidecar's
  // resident set says nothing about kvrail's: the tables and fds below still must not grow.
  (void)rss_last;
#else
  EXPECT_LE(rss_last, rss_first * 11 / 10) << "RSS grew more than 10%";
#endif
  EXPECT_LE(fds_last, fds_first);
  EXPECT_LE(last.registrations(), first.registrations());
  EXPECT_LE(last.data_plane_peers(), first.data_plane_peers());
  EXPECT_LE(last.scheduler_peers(), first.scheduler_peers());
  EXPECT_LE(last.outbox_peers(), first.outbox_peers());
  EXPECT_LE(last.transfers(), first.transfers());
  EXPECT_LE(last.strands(), first.strands());
  EXPECT_LE(last.engines(), first.engines());
  // Rooms: the successful ones are forgotten at once; none is left.
  EXPECT_LE(last.rooms(), first.rooms());
}

int PortOf(const std::string& session_id) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(session_id.substr(session_id.rfind(':') + 1), &port)) << session_id;
  return port;
}

// Waits until the log of the sidecar `name` (Deployment::LogPath) says `needle`; the
// log's text when it never does.
absl::Status AwaitLog(const std::string& name, const std::string& needle, absl::Duration timeout) {
  const std::string path = Deployment::LogPath(name);
  const absl::Time deadline = absl::Now() + timeout;
  std::string text;
  while (absl::Now() < deadline) {
    std::ifstream log(path);
    text.assign(std::istreambuf_iterator<char>(log), std::istreambuf_iterator<char>());
    if (text.find(needle) != std::string::npos) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("no \"", needle, "\" in ", path, ":\n", text));
}

// One decode, which has landed room 1; the prefill probes every 2 s and drops a session silent
// for 3 s. Null (the failure recorded) when that did not work.
std::unique_ptr<Deployment> StartProbing() {
  DeploymentOptions options;
  options.pages = 4;
  options.prefill_args = {"--heartbeat-interval", "2", "--registration-ttl", "3"};
  auto started = Deployment::Start(options);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return nullptr;
  OneRoom(**started, 1);
  return *std::move(started);
}

// A decode stopped (SIGSTOP) for longer than the prefill's --registration-ttl answers no probe:
// the prefill drops its session, as it drops a host cut off. Resumed, the decode sees that its
// ticker was held and registers again with the next room, which lands.
TEST(RestartTest, ADecodeStoppedPastTheTtlIsDroppedThenServedAgainOnceResumed) {
  const std::unique_ptr<Deployment> deployment = StartProbing();
  if (deployment == nullptr || HasFailure()) return;
  Deployment& d = *deployment;
  const std::string session = d.decode(0).session_id;
  d.decode(0).sidecar->Signal(SIGSTOP);
  const absl::Status dropped = AwaitLog(
      "prefill", absl::StrCat("Decode session ", session, " is unreachable"), absl::Seconds(30));
  d.decode(0).sidecar->Signal(SIGCONT);
  ASSERT_TRUE(dropped.ok()) << dropped;
  // Its ticker's next turn finds it was held, before the engine's next room.
  const absl::Status noticed = AwaitLog("decode0", "registering again", absl::Seconds(10));
  ASSERT_TRUE(noticed.ok()) << noticed;
  OneRoom(d, 2);
}

enum class Taker { kSilentProgram, kAnotherDecode };

class PortTakenTest : public ::testing::TestWithParam<Taker> {};

// Nothing kept alive by a stranger: a decode dies and, before the prefill's next probe, another
// program takes its handshake port, so that the port still accepts connections. The prefill
// must still drop the session: a kvrail handshake server there answers with another session
// key (dropped at the next probe); a program that never speaks is dropped after
// --registration-ttl. Then a restarted decode lands a room as before.
TEST_P(PortTakenTest, ADeadDecodesPortTakenBySomebodyElseDoesNotKeepItsSession) {
  const std::unique_ptr<Deployment> deployment = StartProbing();
  if (deployment == nullptr || HasFailure()) return;
  Deployment& d = *deployment;
  const std::string session = d.decode(0).session_id;
  const int port = PortOf(session);
  // The prefill is stopped while the port changes hands, so that no probe finds it refused.
  d.prefill().sidecar->Signal(SIGSTOP);
  d.decode(0).sidecar->Signal(SIGKILL);
  ASSERT_TRUE(d.decode(0).sidecar->Wait(absl::Seconds(10)).ok());
  std::optional<test_support::SilentListener> program;
  absl::StatusOr<std::unique_ptr<transport::HandshakeServer>> decode;
  if (GetParam() == Taker::kSilentProgram) {
    program.emplace(port);
    ASSERT_TRUE(program->bound()) << "port " << port;
  } else {
    decode = transport::HandshakeServer::Start("127.0.0.1", port, [] {
      v1::HandshakeDescriptor descriptor;
      descriptor.set_version(1);
      descriptor.set_session_key_digest(std::string(32, 'x'));
      return absl::StatusOr<v1::HandshakeDescriptor>(descriptor);
    });
    ASSERT_TRUE(decode.ok()) << decode.status();
  }
  d.prefill().sidecar->Signal(SIGCONT);
  const std::string reason = GetParam() == Taker::kSilentProgram
                                 ? absl::StrCat("Decode session ", session, " is unreachable")
                                 : absl::StrCat("Decode session ", session,
                                                " is gone: its handshake endpoint answers "
                                                "with another session key");
  const absl::Status dropped = AwaitLog("prefill", reason, absl::Seconds(30));
  EXPECT_TRUE(dropped.ok()) << dropped;
  // Its registration, data-plane link, PUSH route and scheduler queue go with it.
  v1::SidecarStats stats;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); absl::Now() < until;) {
    stats = d.Stats(d.prefill()).value();
    if (stats.registrations() + stats.data_plane_peers() + stats.scheduler_peers() +
            stats.outbox_peers() ==
        0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(stats.registrations(), 0u);
  EXPECT_EQ(stats.data_plane_peers(), 0u);
  EXPECT_EQ(stats.scheduler_peers(), 0u);
  EXPECT_EQ(stats.outbox_peers(), 0u);
  ASSERT_TRUE(d.RestartDecode(0).ok());
  OneRoom(d, 2);
}

INSTANTIATE_TEST_SUITE_P(Takers, PortTakenTest,
                         ::testing::Values(Taker::kSilentProgram, Taker::kAnotherDecode),
                         [](const ::testing::TestParamInfo<Taker>& info) {
                           return info.param == Taker::kSilentProgram ? "SilentProgram"
                                                                      : "AnotherDecode";
                         });

}  // namespace
}  // namespace kvrail::chaos
