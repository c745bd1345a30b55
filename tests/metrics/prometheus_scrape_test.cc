// Debian's real Prometheus scrapes a running cluster (bootstrap, one prefill and one decode
// sidecar, their engine-sims: cluster/cluster.h with --metrics-port 0 everywhere) every
// second, and its HTTP API answers a rate of kvrail_rooms_total that agrees with the rooms run.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/cluster.h"
#include "cluster/process/subprocess.h"
#include "tests/support/kvrail_binary.h"
#include "tests/support/ports.h"

namespace kvrail {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr int kRooms = 6;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPrometheus, X_OK) != 0) GTEST_SKIP() << kPrometheus << " is not installed";
    cluster::ClusterOptions options;
    options.kvrail = testing::KvrailBinary();
    options.prefill_tp = 1;
    options.decode_tp = 1;
    options.shape.layers = 2;
    options.shape.pages = 64;
    options.metrics = true;
    auto cluster = cluster::Cluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    for (const cluster::Member* m : {&cluster_->bootstrap_server(), &cluster_->prefill_sidecar(0),
                                     &cluster_->decode_sidecar(0)}) {
      ASSERT_FALSE(m->metrics.empty()) << m->name << " announced no metrics=host:port";
      targets_.push_back(absl::StrCat("'", m->metrics, "'"));
    }
    const std::string config = absl::StrCat(TempDir(), "/prometheus.yml");
    std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          << "scrape_configs:\n  - job_name: kvrail\n    static_configs:\n"
                          << "      - targets: [" << absl::StrJoin(targets_, ", ") << "]\n";
    // A port the kernel called free can be taken by another test before Prometheus binds it;
    // Prometheus then exits. Such a start is tried again on a fresh port, up to 3 times.
    for (int attempt = 0; attempt < 3 && prometheus_ == nullptr; ++attempt) {
      const absl::StatusOr<int> port = kvrail::testing::FreePort();
      ASSERT_TRUE(port.ok()) << port.status();
      port_ = *port;
      process::SpawnOptions spawn = process::SpawnOptions::ContainedTool();
      spawn.argv = {kPrometheus, absl::StrCat("--config.file=", config),
                    absl::StrCat("--storage.tsdb.path=", TempDir(), "/tsdb"),
                    absl::StrCat("--web.listen-address=127.0.0.1:", port_)};
      spawn.stderr_mode = process::SpawnOptions::Stderr::kFile;
      spawn.stderr_path = absl::StrCat(TempDir(), "/prometheus.log");
      auto prometheus = process::Subprocess::Start(spawn);
      ASSERT_TRUE(prometheus.ok()) << prometheus.status();
      httplib::Client ready("127.0.0.1", port_);
      ready.set_connection_timeout(1);
      const bool up = Until(absl::Seconds(60), [&] {
        if ((*prometheus)->Wait(absl::ZeroDuration()).ok()) return true;  // exited
        httplib::Result res = ready.Get("/-/ready");
        return res && res->status == 200;
      });
      ASSERT_TRUE(up) << "Prometheus on port " << port_ << " not ready in 60 s; its log:\n"
                      << Log();
      if ((*prometheus)->Wait(absl::ZeroDuration()).ok()) continue;  // try a fresh port
      prometheus_ = *std::move(prometheus);
    }
    ASSERT_NE(prometheus_, nullptr) << "Prometheus exited at start 3 times; its log:\n" << Log();
    api_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    api_->set_connection_timeout(2);
    api_->set_read_timeout(5);
  }

  void TearDown() override {
    if (prometheus_) prometheus_->Stop();  // SIGTERM, then SIGKILL after a grace
    if (cluster_) cluster_->Stop();
  }

  // GET <path>?<params> from Prometheus's API, parsed; null when it did not answer 200.
  nlohmann::json Get(const std::string& path, const httplib::Params& params = {}) {
    httplib::Result res = api_->Get(path, params, httplib::Headers{});
    if (!res || res->status != 200) return nullptr;
    return nlohmann::json::parse(res->body, nullptr, false);
  }

  // The value of an instant query with one result (its sum), or -1 without one.
  double Query(const std::string& promql) {
    nlohmann::json answer = Get("/api/v1/query", {{"query", promql}});
    if (answer.is_null() || answer.value("status", "") != "success") return -1;
    const nlohmann::json& result = answer["data"]["result"];
    if (!result.is_array() || result.size() != 1) return -1;
    return std::stod(result[0]["value"][1].get<std::string>());
  }

  // Polls until `done` or the deadline; false on timeout.
  template <typename Done>
  bool Until(absl::Duration timeout, Done done) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  std::string Log() {
    std::ifstream in(absl::StrCat(TempDir(), "/prometheus.log"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text.size() > 4000 ? text.substr(text.size() - 4000) : text;
  }

  std::unique_ptr<cluster::Cluster> cluster_;
  std::vector<std::string> targets_;
  int port_ = 0;
  std::unique_ptr<process::Subprocess> prometheus_;
  std::unique_ptr<httplib::Client> api_;
};

TEST_F(PrometheusScrapeTest, PrometheusScrapesEveryProcessAndItsRateAgreesWithTheRooms) {
  // Every target up, and the sidecars' room counters sampled at 0 before any room runs.
  ASSERT_TRUE(Until(absl::Seconds(60),
                    [&] {
                      nlohmann::json targets = Get("/api/v1/targets");
                      if (targets.is_null()) return false;
                      int up = 0;
                      for (const auto& t : targets["data"]["activeTargets"])
                        up += t.value("health", "") == "up";
                      return up == static_cast<int>(targets_.size());
                    }))
      << "targets not up: " << Get("/api/v1/targets").dump() << "\n"
      << Log();
  ASSERT_TRUE(Until(absl::Seconds(30), [&] {
    return Query("count(kvrail_rooms_total{outcome=\"succeeded\"})") == 2;
  }));
  EXPECT_EQ(Query("kvrail_bootstrap_registered_ranks"), 1);

  // Rooms, one after another, each reported done by both engine-sims.
  for (uint64_t room = 1; room <= kRooms; ++room) {
    cluster_->SendAll(room, 96, 5);
    int pending = cluster_->sim_count();
    while (pending > 0) {
      std::pair<int, std::string> line;
      ASSERT_TRUE(cluster_->NextLine(absl::Seconds(30), line)) << "room " << room;
      if (absl::StartsWith(line.second, absl::StrCat("done ", room, " "))) {
        ASSERT_TRUE(absl::StrContains(line.second, " ok")) << line.second;
        --pending;
      }
    }
  }
  // Each room ends once on the prefill sidecar and once on the decode sidecar.
  const double ended = 2.0 * kRooms;
  ASSERT_TRUE(Until(absl::Seconds(30), [&] {
    return Query("sum(kvrail_rooms_total{outcome=\"succeeded\"})") == ended;
  })) << Log();
  const double rate = Query("sum(rate(kvrail_rooms_total[30s]))");
  const double increase = Query("sum(increase(kvrail_rooms_total[30s]))");
  EXPECT_GT(rate, 0);
  // increase() extrapolates to the window's edges: at least the rooms, never wildly more.
  EXPECT_GE(increase, ended * 0.99);
  EXPECT_LE(increase, ended * 2);
  // rate() is the same increase per second over the window (evaluated a moment apart).
  EXPECT_GE(rate * 30, ended * 0.99);
  EXPECT_LE(rate * 30, ended * 2);
  EXPECT_EQ(Query("sum(kvrail_rooms_total{outcome=\"failed\"})"), -1);  // no such series
  EXPECT_GT(Query("sum(kvrail_bytes_total)"), 0);
  EXPECT_EQ(Query("sum(kvrail_room_duration_seconds_count)"), ended);
  // The data plane's tables: the prefill's endpoints to its one decode peer (one per lane; the
  // decode opens none), and each sidecar's arena registered.
  EXPECT_EQ(Query("sum(kvrail_table_entries{table=\"data_plane_peers\"})"), 1);
  EXPECT_GT(Query("sum(kvrail_table_entries{table=\"endpoints\"})"), 0);
  EXPECT_EQ(Query("sum(kvrail_table_entries{table=\"regions\"})"), 2);
}

}  // namespace
}  // namespace kvrail
