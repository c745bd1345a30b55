// CachePD revisions between real kvrail processes (docs/PROTOCOL.md §12.12): a peer pinned to
// one revision (--cachepd-revision) in each role, the bootstrap server, the prefill sidecars
// and the decode sidecar, against peers left on auto. Every room must land with every byte
// checked by its decode engine-sim, each side must say which revision it chose, and the 2026-09
// status values (cached tokens, first-token logprob) must reach the decode engine exactly when
// both ends of a pair speak 2026-09. Where two pinned peers cannot meet, the room fails at
// once, never by timeout.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/cluster.h"
#include "tests/e2e/sidecar_peer.h"
#include "tools/engine_sim/engine_sim.h"

namespace kvrail {
namespace {

constexpr char kSnapshot[] = "snapshot";
constexpr char k2026_09[] = "2026-09";

struct Pins {
  std::string bootstrap;
  std::vector<std::string> prefills;  // one for all ranks, or one per rank
  std::string decode;
};

// A room's outcome on one engine-sim: "ok ..." or "failed ...", and for a decode its values line.
struct Outcome {
  std::string done;
  std::string values;
};

class RevisionCluster {
 public:
  // P=2 -> D=1, small rooms, logs in a directory of their own.
  static std::unique_ptr<RevisionCluster> Start(const Pins& pins) {
    auto self = std::unique_ptr<RevisionCluster>(new RevisionCluster());
    // Under Bazel's scratch directory, which Bazel clears (logs are not sockets: the path's
    // length does not matter); /tmp outside Bazel.
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kvrail-revision-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) return nullptr;
    self->log_dir_ = dir;
    cluster::ClusterOptions options;
    options.kvrail = testing::KvrailBinary();
    options.prefill_tp = 2;
    options.decode_tp = 1;
    options.shape.layers = 2;
    options.shape.pages = 96;
    options.log_dir = self->log_dir_;
    options.bootstrap_revision = pins.bootstrap;
    options.prefill_revisions = pins.prefills;
    options.decode_revision = pins.decode;
    absl::StatusOr<std::unique_ptr<cluster::Cluster>> cluster = cluster::Cluster::Start(options);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return nullptr;
    self->cluster_ = *std::move(cluster);
    return self;
  }

  cluster::Cluster& cluster() { return *cluster_; }

  // Runs `room` on every engine-sim (prefill ranks first, then the decode), or on the decode's
  // alone, and waits for each one's outcome.
  std::vector<Outcome> Run(uint64_t room, int64_t prompt, bool decode_only = false) {
    const int64_t token = static_cast<int64_t>(room) + 1000;
    if (decode_only) {
      cluster_->Send(cluster_->sim_count() - 1, room, prompt, token);
    } else {
      cluster_->SendAll(room, prompt, token);
    }
    std::vector<Outcome> out(cluster_->sim_count());
    int pending = decode_only ? 1 : cluster_->sim_count();
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (pending > 0 && absl::Now() < deadline) {
      std::pair<int, std::string> line;
      if (!cluster_->NextLine(deadline - absl::Now(), line)) break;
      std::vector<std::string> words = absl::StrSplit(line.second, absl::MaxSplits(' ', 2));
      uint64_t id = 0;
      if (words.size() < 3 || !absl::SimpleAtoi(words[1], &id) || id != room) continue;
      if (words[0] == "values") out[line.first].values = words[2];
      if (words[0] == "done") {
        out[line.first].done = words[2];
        --pending;
      }
    }
    return out;
  }

  // The whole log of cluster member `name` ("bootstrap", "prefill-sidecar-0", ...).
  std::string Log(const std::string& name) const {
    std::ifstream in(absl::StrCat(log_dir_, "/", name, ".log"));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Whether process `name`'s log says `text` within `timeout`: a process logs a refusal after it
  // answered it, so the answer's effect (a failed room) may come first (CI saw that race).
  bool AwaitLog(const std::string& name, absl::string_view text,
                absl::Duration timeout = absl::Seconds(10)) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (!absl::StrContains(Log(name), text)) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return true;
  }

 private:
  RevisionCluster() = default;
  std::string log_dir_;
  std::unique_ptr<cluster::Cluster> cluster_;
};

std::string ValuesOf2026_09(uint64_t room, int64_t prompt) {
  return absl::StrCat("cached_tokens=", sim::ExpectedCachedTokens(room, prompt),
                      " first_token_logprob=", sim::ExpectedLogprob(room));
}

constexpr char kNoValues[] = "cached_tokens=0 first_token_logprob=none";

// Every room of `rooms` lands on all three engine-sims, and the decode's values are `values`
// (empty: ValuesOf2026_09).
void ExpectRoomsLand(RevisionCluster& c, const std::vector<uint64_t>& rooms,
                     const std::string& values) {
  for (uint64_t room : rooms) {
    const int64_t prompt = 100 + 37 * static_cast<int64_t>(room);
    std::vector<Outcome> outcomes = c.Run(room, prompt);
    for (size_t i = 0; i < outcomes.size(); ++i) {
      EXPECT_TRUE(absl::StartsWith(outcomes[i].done, "ok"))
          << "room " << room << " engine-sim " << i << ": " << outcomes[i].done;
    }
    EXPECT_EQ(outcomes.back().values, values.empty() ? ValuesOf2026_09(room, prompt) : values)
        << "room " << room;
  }
}

// How often `text` stands in `log`.
size_t CountOf(const std::string& log, absl::string_view text) {
  size_t count = 0;
  for (size_t at = log.find(std::string(text)); at != std::string::npos;
       at = log.find(std::string(text), at + 1)) {
    ++count;
  }
  return count;
}

// What each side logged it chose: the prefill ranks' bootstrap registration, the decode's view
// of the node, and the prefill ranks' status form for the decode.
void ExpectChosen(RevisionCluster& c, const std::string& node, const std::string& registration) {
  for (int p = 0; p < 2; ++p) {
    const std::string prefill = c.Log(absl::StrCat("prefill-sidecar-", p));
    EXPECT_TRUE(absl::StrContains(prefill, absl::StrCat("event=bootstrap_registered"))) << prefill;
    EXPECT_TRUE(absl::StrContains(prefill, absl::StrCat("event=decode_registration session=")))
        << prefill;
    EXPECT_TRUE(absl::StrContains(
        prefill, absl::StrCat("cachepd_revision=", registration,
                              " status_frames=", registration == kSnapshot ? 5 : 7)))
        << prefill;
  }
  const std::string decode = c.Log("decode-sidecar-0");
  EXPECT_TRUE(absl::StrContains(decode, absl::StrCat("event=prefill_node")));
  EXPECT_TRUE(absl::StrContains(
      decode, absl::StrCat("cachepd_revision=", node, " registers_as=", registration)))
      << decode;
}

TEST(RevisionTest, EveryPeerOnAutoSpeaks2026_09AndTheDecodeEngineGetsTheNewValues) {
  auto c = RevisionCluster::Start({});
  ASSERT_NE(c, nullptr);
  ExpectRoomsLand(*c, {1, 2, 3}, "");
  ExpectChosen(*c, k2026_09, k2026_09);
  EXPECT_TRUE(
      absl::StrContains(c->Log("prefill-sidecar-0"), "event=bootstrap_registered bootstrap="));
  EXPECT_TRUE(absl::StrContains(c->Log("prefill-sidecar-0"), "cachepd_revision=2026-09"));
  // P=2 into D=1 slices every row's heads: each prefill rank logs its route's copies once, at
  // its first room (issue 31: strided copies, posted whole over UCX).
  for (int p = 0; p < 2; ++p) {
    const std::string prefill = c->Log(absl::StrCat("prefill-sidecar-", p));
    EXPECT_EQ(CountOf(prefill, "event=route session="), 1u) << prefill;
    EXPECT_TRUE(absl::StrContains(prefill, "decode_rank=0 of 1")) << prefill;
    EXPECT_TRUE(absl::StrContains(prefill, "a strided copy per run of pages, posted whole"))
        << prefill;
  }
}

// A bootstrap server of the snapshot (its sync answer has no cache_fields_by_stage): the
// prefills register the snapshot's PUT, the decode reads a snapshot layout and registers in its
// form, and the prefills answer in 5 frames.
TEST(RevisionTest, ASnapshotBootstrapServerMakesTheWholeNodeSpeakTheSnapshot) {
  auto c = RevisionCluster::Start({kSnapshot, {}, ""});
  ASSERT_NE(c, nullptr);
  ExpectRoomsLand(*c, {1, 2}, kNoValues);
  ExpectChosen(*c, kSnapshot, kSnapshot);
  EXPECT_TRUE(
      absl::StrContains(c->Log("prefill-sidecar-1"), "event=bootstrap_registered bootstrap="));
  EXPECT_TRUE(absl::StrContains(c->Log("prefill-sidecar-1"), "cachepd_revision=snapshot"));
}

// Snapshot-era prefill ranks beside a 2026-09 bootstrap server and decode: the server keeps
// their snapshot layout, the decode registers in it, and the prefills answer in 5 frames.
TEST(RevisionTest, SnapshotPrefillsAreReadByA2026_09BootstrapAndDecode) {
  auto c = RevisionCluster::Start({"", {kSnapshot}, ""});
  ASSERT_NE(c, nullptr);
  ExpectRoomsLand(*c, {1, 2}, kNoValues);
  ExpectChosen(*c, kSnapshot, kSnapshot);
}

// A snapshot-era decode (it reads exactly 5 status frames) against a 2026-09 node: it registers
// the snapshot's contract, and the 2026-09 prefills answer it in 5 frames.
TEST(RevisionTest, ASnapshotDecodeIsAnsweredInFiveFramesByA2026_09Node) {
  auto c = RevisionCluster::Start({"", {}, kSnapshot});
  ASSERT_NE(c, nullptr);
  ExpectRoomsLand(*c, {1, 2}, kNoValues);
  ExpectChosen(*c, k2026_09, kSnapshot);
}

// A node mid-upgrade: rank 0 speaks the snapshot alone, rank 1 both. Rank 0 registers first, so
// the node's layout is the snapshot's and the decode registers in it with both ranks.
TEST(RevisionTest, ANodeMidUpgradeLandsRoomsInTheFormOfItsFirstRegistration) {
  auto c = RevisionCluster::Start({"", {kSnapshot, ""}, ""});
  ASSERT_NE(c, nullptr);
  ExpectRoomsLand(*c, {1, 2}, kNoValues);
  ExpectChosen(*c, kSnapshot, kSnapshot);
}

// Peers that cannot meet (upstream's "upgrade together"): a decode that speaks 2026-09 alone and
// prefills that speak the snapshot alone. The prefills refuse the 2026-09 registration and say
// so, and the rooms fail at once, not by a timeout.
TEST(RevisionTest, PinnedPeersThatCannotMeetFailTheRoomAtOnceNamingTheRevision) {
  auto c = RevisionCluster::Start({"", {kSnapshot}, k2026_09});
  ASSERT_NE(c, nullptr);
  const absl::Time start = absl::Now();
  std::vector<Outcome> outcomes = c->Run(1, 200, /*decode_only=*/true);
  EXPECT_TRUE(absl::StartsWith(outcomes.back().done, "failed")) << outcomes.back().done;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_TRUE(c->AwaitLog("prefill-sidecar-0", "pinned to snapshot"))
      << c->Log("prefill-sidecar-0");
}

}  // namespace
}  // namespace kvrail
