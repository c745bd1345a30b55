// The whole request path between processes: bootstrap, sidecars and engine-sims (tools/demo
// cluster), for the routes of CACHEPD §6 and the failures of §1.5 and §1.6.
#include <gtest/gtest.h>
#include <signal.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/cluster.h"
#include "cluster/process/subprocess.h"
#include "tests/e2e/sidecar_peer.h"

namespace kvrail {
namespace {

layout::KvShape SmallShape() {
  layout::KvShape shape;
  shape.layers = 2;
  shape.pages = 96;
  return shape;
}

// ---- every route shape, through `kvrail demo` -----------------------------------------------

struct Route {
  const char* name;
  std::vector<std::string> args;
  // Where the KV arenas must live: the sidecars' allocations ("ucx-shm" over shared memory,
  // "memfd" over tcp) by default, "posix-shm" with --arena engine.
  const char* placement;
  // Where not empty: what prefill rank 0's log says of its route (event=route: its copies, its
  // lanes).
  const char* copies = "";
  // Where not empty: what decode rank 0's log says (event=row_staging).
  const char* decode_says = "";
};

class DemoRouteTest : public ::testing::TestWithParam<Route> {};

// The whole text of the file at `path` ("" when there is none).
std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A scratch directory of this test's own, under Bazel's (or /tmp).
std::string ScratchDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST_P(DemoRouteTest, EveryByteAndTokenChecks) {
  const std::string dir = ScratchDir(GetParam().name);
  const std::string logs = dir + "/logs";
  std::vector<std::string> argv = {
      testing::KvrailBinary(), "demo", "--layers",  "2",  "--rooms", "6", "--min-prompt", "64",
      "--max-prompt",          "400",  "--log-dir", logs, "--json"};
  for (const std::string& a : GetParam().args) argv.push_back(a);
  auto demo = process::Subprocess::Start(argv, {}, dir + "/screen.txt");
  ASSERT_TRUE(demo.ok()) << demo.status();
  absl::StatusOr<std::string> summary = (*demo)->ReadUntil("{", absl::Seconds(120));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_NE(summary->find("\"failures\": 0"), std::string::npos) << *summary;
  EXPECT_NE(summary->find(absl::StrCat("\"arena_placement\": \"", GetParam().placement, "\"")),
            std::string::npos)
      << *summary;
  // The transfer apart from the end-to-end figures: a data-plane rate and Ready -> Success times.
  for (const char* key : {"\"transfer_gbps\": ", "\"transfer_ms_p50\": ", "\"transfer_share\": "}) {
    const size_t at = summary->find(key);
    ASSERT_NE(at, std::string::npos) << key << " in " << *summary;
    double value = 0;
    const std::string rest = summary->substr(at + std::strlen(key));
    ASSERT_TRUE(absl::SimpleAtod(rest.substr(0, rest.find_first_of(",}")), &value)) << rest;
    EXPECT_GT(value, 0) << key << " in " << *summary;
  }
  EXPECT_EQ((*demo)->Wait(absl::Seconds(30)).value_or(-1), 0);
  // The screen holds the demo's own lines; each process's log is its file in --log-dir.
  const std::string screen = ReadText(dir + "/screen.txt");
  EXPECT_FALSE(absl::StrContains(screen, " info ") || absl::StrContains(screen, "level=info"))
      << screen;
  EXPECT_NE(summary->find(absl::StrCat("\"log_dir\": \"", logs, "\"")), std::string::npos)
      << *summary;
  for (const char* process : {"bootstrap", "prefill-sidecar-0", "decode-sidecar-0"}) {
    EXPECT_TRUE(absl::StrContains(ReadText(absl::StrCat(logs, "/", process, ".log")), "info"))
        << process << ".log in " << logs;
  }
  const std::string prefill = ReadText(logs + "/prefill-sidecar-0.log");
  EXPECT_TRUE(absl::StrContains(prefill, GetParam().copies)) << prefill;
  // A route is logged once, at its first room, however many rooms it carries.
  std::map<std::string, int> routes;
  for (absl::string_view line : absl::StrSplit(prefill, '\n')) {
    const size_t at = line.find("event=route session=");
    if (at == absl::string_view::npos) continue;
    const absl::string_view session = line.substr(at + std::strlen("event=route session="));
    ++routes[std::string(session.substr(0, session.find(' ')))];
  }
  EXPECT_FALSE(routes.empty()) << prefill;
  for (const auto& [session, lines] : routes) EXPECT_EQ(lines, 1) << session << " in " << prefill;
  const std::string decode = ReadText(logs + "/decode-sidecar-0.log");
  EXPECT_TRUE(absl::StrContains(decode, GetParam().decode_says)) << decode;
}

// A child that cannot start is named, with the reason it gave and what to do about it: here a
// sidecar of `--link verbs` on a machine without an RDMA device.
TEST(DemoFailureTest, ASidecarThatCannotStartIsNamedWithItsReasonAndAHint) {
  if (std::filesystem::exists("/sys/class/infiniband") &&
      !std::filesystem::is_empty("/sys/class/infiniband")) {
    GTEST_SKIP() << "this machine has an RDMA device: the sidecars start";
  }
  const std::string dir = ScratchDir("no_rdma");
  auto demo = process::Subprocess::Start(
      {testing::KvrailBinary(), "demo", "--link", "verbs", "--verbs-provider", "libibverbs",
       "--layers", "2", "--rooms", "1", "--log-dir", dir + "/logs"},
      {}, dir + "/screen.txt");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->Wait(absl::Seconds(60)).value_or(-1), 1);
  const std::string screen = ReadText(dir + "/screen.txt");
  EXPECT_TRUE(absl::StrContains(screen, "prefill-sidecar-0 did not start: ")) << screen;
  EXPECT_TRUE(absl::StrContains(screen, "lists no RDMA devices")) << screen;
  EXPECT_TRUE(absl::StrContains(screen, "--verbs-provider softverbs")) << screen;
  EXPECT_TRUE(absl::StrContains(screen, dir + "/logs/prefill-sidecar-0.log")) << screen;
  EXPECT_FALSE(absl::StrContains(screen, "error: sidecar: error:")) << screen;
}

INSTANTIATE_TEST_SUITE_P(
    Routes, DemoRouteTest,
    ::testing::Values(
        Route{"p2_d2", {"--prefill-tp", "2", "--decode-tp", "2"}, "ucx-shm"},
        // Over shared memory the writer's lanes store the bytes: every lane.
        Route{"p2_d1_sidecar_arenas",
              {"--prefill-tp", "2", "--decode-tp", "1", "--arena", "sidecar"},
              "ucx-shm",
              "lanes=\"every lane\""},
        // The prefill's lanes store both decode ranks' halves of each source row in one pass
        // (decision 0020), into the decodes' segments that UCX maps.
        Route{"p1_d2_sidecar_arenas",
              {"--prefill-tp", "1", "--decode-tp", "2", "--arena", "sidecar"},
              "ucx-shm"},
        Route{"p1_d2_engine_arenas",
              {"--prefill-tp", "1", "--decode-tp", "2", "--arena", "engine"},
              "posix-shm"},
        // The other head-sliced TP pairs, as strided copies (a page's rows a copy, the default):
        // over shared memory and over tcp, each into both kinds of arena.
        Route{"p4_d2_sidecar_arenas",
              {"--prefill-tp", "4", "--decode-tp", "2", "--arena", "sidecar"},
              "ucx-shm",
              "a strided copy per run of pages, posted whole"},
        Route{"p2_d4_engine_arenas",
              {"--prefill-tp", "2", "--decode-tp", "4", "--arena", "engine"},
              "posix-shm",
              "a strided copy per run of pages, posted whole"},
        Route{"p8_d2_sidecar_arenas",
              {"--prefill-tp", "8", "--decode-tp", "2", "--arena", "sidecar"},
              "ucx-shm",
              "a strided copy per run of pages, posted whole"},
        Route{"tcp_p1_d2_sidecar_arenas",
              {"--prefill-tp", "1", "--decode-tp", "2", "--link", "tcp", "--arena", "sidecar"},
              "memfd",
              "a strided copy per run of pages, posted whole"},
        Route{"tcp_p4_d2_engine_arenas",
              {"--prefill-tp", "4", "--decode-tp", "2", "--link", "tcp", "--arena", "engine"},
              "posix-shm",
              "a strided copy per run of pages, posted whole"},
        Route{"tcp_p2_d4_sidecar_arenas",
              {"--prefill-tp", "2", "--decode-tp", "4", "--link", "tcp", "--arena", "sidecar"},
              "memfd",
              "a strided copy per run of pages, posted whole"},
        Route{
            "mla_p4_d2_dummies", {"--prefill-tp", "4", "--decode-tp", "2", "--latent"}, "ucx-shm"},
        // A replicated latent stays whole at 8:2: each decode rank's latent from one prefill
        // rank, whole pages, the other six ranks dummies.
        Route{"mla_p8_d2_dummies",
              {"--prefill-tp", "8", "--decode-tp", "2", "--latent", "--link", "tcp"},
              "memfd",
              "copies=\"whole pages\""},
        Route{
            "two_stages_p2_d1", {"--prefill-tp", "2", "--decode-tp", "1", "--pp", "2"}, "ucx-shm"},
        // Over tcp the decode's lanes receive: each of its two sources writes on a lane of
        // its own.
        Route{"tcp_p2_d1",
              {"--link", "tcp"},
              "memfd",
              "lanes=\"lane 0 of 2 (source 1 of the decode's 2: each decode lane reads one "
              "source)\""},
        // --verify-digest: a decode fails any kvrail rank's Success that comes
        // without a matching digest, so no failure means every digest matched.
        Route{"digests_two_stages_p2_d2",
              {"--prefill-tp", "2", "--decode-tp", "2", "--pp", "2", "--verify-digest"},
              "ucx-shm"},
        // The raw verbs backend over the software provider (shared memory, never hardware):
        // at 1:2 each decode rank's rows are gathered from the prefill's strided rows by
        // scatter-gather lists; at 4:2 (below) they land apart, a write each.
        Route{"verbs_softverbs_p1_d2",
              {"--prefill-tp", "1", "--decode-tp", "2", "--link", "verbs", "--verbs-provider",
               "softverbs"},
              "memfd",
              "a strided copy per run of pages, posted as writes gathering up to 16 rows each"},
        Route{"verbs_softverbs_digests_p4_d2_engine_arenas",
              {"--prefill-tp", "4", "--decode-tp", "2", "--link", "verbs", "--verbs-provider",
               "softverbs", "--arena", "engine", "--verify-digest"},
              "posix-shm"},
        // Row staging (docs/PROTOCOL.md A.8): at 2:1 over verbs the rows land apart, so the
        // decode offers slots (--row-staging auto) and scatters what each rank staged.
        Route{"verbs_softverbs_row_staging_digests_p2_d1",
              {"--prefill-tp", "2", "--decode-tp", "1", "--link", "verbs", "--verbs-provider",
               "softverbs", "--row-staging-bytes", "67108864", "--verify-digest"},
              "memfd",
              "a room the decode offers a staging slot for goes back to back into the slot",
              "prefill_rank=1 staged=yes"},
        // A hashed room is sent as strided copies too; its digest takes their rows.
        // --row-staging all: over tcp and shared memory too, rows that land apart go back to
        // back into the decode's slots, and the decode scatters them.
        Route{"tcp_row_staging_all_p2_d1",
              {"--prefill-tp", "2", "--decode-tp", "1", "--link", "tcp", "--row-staging-bytes",
               "67108864", "--row-staging", "all"},
              "memfd",
              "",
              "prefill_rank=1 staged=yes"},
        Route{"row_staging_all_p4_d2_engine_arenas",
              {"--prefill-tp", "4", "--decode-tp", "2", "--arena", "engine", "--row-staging-bytes",
               "67108864", "--row-staging", "all"},
              "posix-shm",
              "",
              "prefill_rank=1 staged=yes"},
        Route{"digests_tcp_p4_d2_engine_arenas",
              {"--prefill-tp", "4", "--decode-tp", "2", "--link", "tcp", "--arena", "engine",
               "--verify-digest"},
              "posix-shm",
              "a strided copy per run of pages, posted whole"},
        // The GPU staging path with memcpy for cudaMemcpyAsync (--emulate-gpu-arena): every
        // byte the decode engine-sims check came through both mirrors.
        Route{"emulated_gpu_staging_p2_d1_engine_arenas",
              {"--arena", "engine", "--emulate-gpu-arena"},
              "posix-shm"},
        Route{"emulated_gpu_staging_digests_tcp_p1_d2_engine_arenas",
              {"--prefill-tp", "1", "--decode-tp", "2", "--link", "tcp", "--arena", "engine",
               "--emulate-gpu-arena", "--verify-digest"},
              "posix-shm"}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- failures ---------------------------------------------------------------------------------

// Outcome lines of the cluster's engine-sims, kept by (sim, room) as they arrive.
class Outcomes {
 public:
  explicit Outcomes(cluster::Cluster& cluster) : cluster_(cluster) {}
  // The rest of engine-sim `index`'s "done <room> ..." line ("ok ..." or "failed ...").
  absl::StatusOr<std::string> Wait(int index, uint64_t room, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      auto it = seen_.find({index, room});
      if (it != seen_.end()) return it->second;
      std::pair<int, std::string> line;
      if (absl::Now() >= deadline || !cluster_.NextLine(deadline - absl::Now(), line)) {
        return absl::DeadlineExceededError(
            absl::StrCat("no outcome for room ", room, " from engine-sim ", index));
      }
      std::vector<std::string> words = absl::StrSplit(line.second, absl::MaxSplits(' ', 2));
      uint64_t id = 0;
      if (words.size() == 3 && words[0] == "done" && absl::SimpleAtoi(words[1], &id)) {
        seen_[{line.first, id}] = words[2];
      }
    }
  }

 private:
  cluster::Cluster& cluster_;
  std::map<std::pair<int, uint64_t>, std::string> seen_;
};

cluster::ClusterOptions Options(int p, int d) {
  cluster::ClusterOptions options;
  options.kvrail = testing::KvrailBinary();
  options.prefill_tp = p;
  options.decode_tp = d;
  options.shape = SmallShape();
  options.sidecar_args = {"--heartbeat-interval", "2", "--heartbeat-failures", "2"};
  return options;
}

TEST(FailureTest, APrefillNodeKilledMidRoomFailsTheDecodesRoomsWithinTheHeartbeatWindow) {
  auto cluster = cluster::Cluster::Start(Options(2, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster::Cluster& c = **cluster;
  Outcomes outcomes(c);
  // Warm up: one room end to end, so the decode has registered with the prefill ranks.
  c.SendAll(1, 128, 5);
  for (int i = 0; i < c.sim_count(); ++i) {
    auto done = outcomes.Wait(i, 1, absl::Seconds(30));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(absl::StartsWith(*done, "ok")) << *done;
  }
  // Room 2 reaches the decode only: it pre-allocates and waits for the prefill's writes.
  const int decode_sim = c.prefill_ranks();
  c.Send(decode_sim, 2, 256, 9);
  absl::SleepFor(absl::Milliseconds(500));
  // The prefill node dies: its bootstrap server, sidecars and engines.
  c.bootstrap_server().process->Signal(SIGKILL);
  for (int p = 0; p < c.prefill_ranks(); ++p) {
    c.prefill_sidecar(p).process->Signal(SIGKILL);
    c.sim(p).process->Signal(SIGKILL);
  }
  const absl::Time killed = absl::Now();
  auto done = outcomes.Wait(decode_sim, 2, absl::Seconds(20));
  ASSERT_TRUE(done.ok()) << done.status();
  const absl::Duration took = absl::Now() - killed;
  EXPECT_TRUE(absl::StartsWith(*done, "failed")) << *done;
  // Two missed probes 2 s apart, plus one probe's timeout: well inside 10 s, never a hang.
  EXPECT_LT(took, absl::Seconds(10)) << *done;
  std::printf("decode room failed %s after the prefill node died: %s\n",
              absl::FormatDuration(took).c_str(), done->c_str());
}

TEST(FailureTest, ADecodeKilledFailsThePrefillsRoomsAndTheSidecarServesOn) {
  auto cluster = cluster::Cluster::Start(Options(1, 1));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster::Cluster& c = **cluster;
  Outcomes outcomes(c);
  // Room 1 reaches the decode first: its pre-allocation lands at the prefill.
  c.Send(1, 1, 256, 3);
  absl::SleepFor(absl::Milliseconds(700));
  c.decode_sidecar(0).process->Signal(SIGKILL);
  c.sim(1).process->Signal(SIGKILL);
  // Now the prefill engine is ready: the writes find no decode.
  const absl::Time start = absl::Now();
  c.Send(0, 1, 256, 3);
  auto done = outcomes.Wait(0, 1, absl::Seconds(30));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(absl::StartsWith(*done, "failed")) << *done;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  std::printf("prefill room failed after the decode died: %s\n", done->c_str());
  // The prefill sidecar is alive and its state for room 1 is gone: the engine can reuse it.
  EXPECT_FALSE(c.prefill_sidecar(0).process->Wait(absl::Milliseconds(1)).ok());
}

// A decode rank that dies just before a 1:2 prefill stores a room's rows for it, on every link:
// the prefill fails the room and serves on, the other decode rank hears one terminal event (its
// engine-sim checks every byte of an "ok"), and once the dead rank is back whole rooms land
// exactly again. Over shared memory the prefill stores the rows (both ranks' in one pass where the
// lanes' timing lets it: decision 0020) into segments that stay mapped in it when their owner
// dies, so the stores cannot fail:
// before the prefill watched its peers' processes (engine/transport/peer_process.h) that room
// reported Success, a second before UCX's keepalive would have noticed. Over tcp the endpoint
// fails (or the prefill's probe finds the decode's handshake endpoint gone first), and over verbs
// the writes go unacknowledged.
class DecodeRankDeathTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodeRankDeathTest, ARoomStoredForADeadDecodeRankFailsAndRoomsLandAfterItsRestart) {
  const std::string link = GetParam();
  cluster::ClusterOptions options = Options(1, 2);
  options.link = link;
  if (link == "verbs") options.verbs_provider = "softverbs";
  options.shape.layers = 32;  // 1 MiB a page at each decode rank, 2 MiB at the prefill
  options.shape.pages = 300;
  auto cluster = cluster::Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster::Cluster& c = **cluster;
  Outcomes outcomes(c);
  c.SendAll(1, 256, 5);
  for (int i = 0; i < c.sim_count(); ++i) {
    auto done = outcomes.Wait(i, 1, absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(absl::StartsWith(*done, "ok")) << *done;
  }
  // Room 2 (4,096 tokens: 512 MiB from the prefill) pre-allocates at both decode ranks. The
  // prefill sidecar is stopped before its engine is ready (the engine-sim fills its pages
  // first), decode rank 1 is killed, and the prefill resumes: it hears Ready and writes the
  // room's rows for both ranks while one of them is gone, before UCX's keepalive or the
  // heartbeat can notice.
  c.Send(1, 2, 4096, 9);
  c.Send(2, 2, 4096, 9);
  absl::SleepFor(absl::Milliseconds(300));
  c.prefill_sidecar(0).process->Signal(SIGSTOP);
  c.Send(0, 2, 4096, 9);
  c.decode_sidecar(1).process->Signal(SIGKILL);
  c.sim(2).process->Signal(SIGKILL);
  (void)c.decode_sidecar(1).process->Wait(absl::Seconds(10));
  absl::SleepFor(absl::Milliseconds(500));  // the prefill's engine is ready meanwhile
  c.prefill_sidecar(0).process->Signal(SIGCONT);
  const absl::Time resumed = absl::Now();
  auto prefill = outcomes.Wait(0, 2, absl::Seconds(30));
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_TRUE(absl::StartsWith(*prefill, "failed")) << *prefill;
  EXPECT_LT(absl::Now() - resumed, absl::Seconds(20)) << *prefill;
  // Decode rank 0 hears one outcome.
  auto rank0 = outcomes.Wait(1, 2, absl::Seconds(30));
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  std::printf("[%s] decode rank 1 dead before room 2's writes: prefill %s; decode rank 0 %s\n",
              link.c_str(), prefill->c_str(), rank0->c_str());
  EXPECT_FALSE(c.prefill_sidecar(0).process->Wait(absl::Milliseconds(1)).ok())
      << "the prefill sidecar died";
  EXPECT_FALSE(c.decode_sidecar(0).process->Wait(absl::Milliseconds(1)).ok())
      << "decode sidecar 0 died";
  // Decode rank 1 comes back (a new process, a new session): whole rooms land at every rank.
  ASSERT_TRUE(c.RestartDecodeSidecar(1).ok());
  ASSERT_TRUE(c.RestartSim(2).ok());
  c.SendAll(3, 1024, 13);
  for (int i = 0; i < c.sim_count(); ++i) {
    auto done = outcomes.Wait(i, 3, absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(absl::StartsWith(*done, "ok")) << "engine-sim " << i << ": " << *done;
  }
}

INSTANTIATE_TEST_SUITE_P(Links, DecodeRankDeathTest, ::testing::Values("shm", "tcp", "verbs"),
                         [](const auto& info) { return std::string(info.param); });

TEST(FailureTest, AMalformedPeerFrameIsRefusedWithAReasonAndOtherRoomsGoOn) {
  char dir[] = "/tmp/kvrail-e2e-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  cluster::ClusterOptions options = Options(1, 1);
  options.log_dir = dir;
  auto cluster = cluster::Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  cluster::Cluster& c = **cluster;
  Outcomes outcomes(c);
  {
    zmq::context_t context;
    zmq::socket_t push(context, zmq::socket_type::push);
    push.set(zmq::sockopt::linger, 2000);
    push.connect(c.prefill_sidecar(0).cachepd_endpoint);
    const std::vector<std::vector<std::string>> garbage = {
        {"None", "10.0.0.1", "0", "x:1", "short", "{}", "1", "0"},  // bad port, base, contract
        {"7", "10.0.0.1:1"},                                        // 2-frame pre-allocation
        {"\xff\xfe", "x", "y"},                                     // not ASCII
    };
    for (const auto& message : garbage) {
      std::vector<zmq::const_buffer> frames;
      for (const std::string& f : message) frames.push_back(zmq::buffer(f));
      ASSERT_TRUE(zmq::send_multipart(push, frames));
    }
  }
  c.SendAll(1, 200, 11);
  for (int i = 0; i < c.sim_count(); ++i) {
    auto done = outcomes.Wait(i, 1, absl::Seconds(30));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(absl::StartsWith(*done, "ok")) << *done;
  }
  c.Stop();
  std::ifstream log(absl::StrCat(dir, "/prefill-sidecar-0.log"));
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("peer message refused"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("frame 2"), std::string::npos) << text.str();
  std::system(absl::StrCat("rm -rf ", dir).c_str());
}

}  // namespace
}  // namespace kvrail
