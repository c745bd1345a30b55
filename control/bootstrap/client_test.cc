#include "control/bootstrap/client.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/server.h"
#include "control/layout/contract.h"
#include "tests/support/ports.h"
#include "tests/support/vectors.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

std::string ReferenceLayout() {
  static const std::string* const layout = new std::string(
      kvrail::testing::LoadVectors(
          "bootstrap.json")["scenarios"][0]["exchanges"][2]["json_body"]["cache_layout"]
          .get<std::string>());
  return *layout;
}

PrefillRegistration Rank(int engine_rank, int world_size = 4, int dp_size = 2) {
  PrefillRegistration r;
  r.world_size = world_size;
  r.dp_size = dp_size;
  r.endpoint = {absl::StrCat("10.2.0.", engine_rank), 18000 + engine_rank};
  r.engine_rank = engine_rank;
  r.contract = *layout::ParseContract(ReferenceLayout());
  return r;
}

// Short budgets: these tests check what the client concludes, not how long it takes.
BootstrapClientOptions Quick() {
  BootstrapClientOptions options;
  options.connect_timeout = milliseconds(500);
  options.read_timeout = milliseconds(500);
  options.retries = 2;
  options.backoff = milliseconds(5);
  options.max_backoff = milliseconds(20);
  options.deadline = milliseconds(5000);
  return options;
}

// Holds a scripted server's answers until it is opened (at the latest after 30 s), so that a
// request finds a server too slow to answer; opened before the server stops.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return open_; });
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A stand-in server whose /route answers are scripted by the test.
class ScriptedServer {
 public:
  explicit ScriptedServer(const httplib::Server::Handler& route) {
    http_.Get("/route", route);
    http_.Put("/route", route);
    port_ = http_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_.listen_after_bind(); });
    while (!http_.is_running()) std::this_thread::sleep_for(milliseconds(1));
  }
  ~ScriptedServer() {
    http_.stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  httplib::Server http_;
  int port_ = 0;
  std::thread thread_;
};

class BootstrapClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.Start("127.0.0.1", 0).ok()); }
  BootstrapClient Client() { return BootstrapClient("127.0.0.1", server_.port(), Quick()); }
  BootstrapServer server_;
};

TEST_F(BootstrapClientTest, RegistersSyncsAndLooksUpRanks) {
  BootstrapClient client = Client();
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(client.RegisterPrefillRank(Rank(rank)).ok()) << rank;
  }
  bool kvrail_node = false;
  absl::StatusOr<plan::PrefillDescription> description = client.Sync(&kvrail_node);
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_TRUE(kvrail_node);  // kvrail's server says so, beside the reference's bytes
  EXPECT_EQ(description->world_size, 4);
  EXPECT_EQ(description->dp_size, 2);
  EXPECT_EQ(description->stage_tp_size, 2);
  EXPECT_EQ(*layout::SerializeContract(description->contract, layout::Revision::kSnapshot),
            ReferenceLayout());
  absl::StatusOr<RankEndpoint> endpoint = client.LookupRank(1, 1);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_EQ(*endpoint, (RankEndpoint{"10.2.0.3", 18003}));
  EXPECT_TRUE(client.Health().ok());
}

TEST_F(BootstrapClientTest, SyncOfAPipelinedNodeCarriesItsStages) {
  BootstrapClient client = Client();
  for (int rank = 0; rank < 8; ++rank) {
    PrefillRegistration r = Rank(rank, 8, 2);
    r.pipeline = plan::PipelineLayout{2, {{"layer.0.k", "layer.0.latent"}, {"layer.1.conv"}}};
    ASSERT_TRUE(client.RegisterPrefillRank(r).ok()) << rank;
  }
  absl::StatusOr<plan::PrefillDescription> description = client.Sync();
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_EQ(description->pp_size, 2);
  EXPECT_EQ(description->stage_tp_size, 2);
  EXPECT_EQ(description->pipeline.fields_by_stage.size(), 2u);
}

TEST_F(BootstrapClientTest, ARefusedRegistrationNamesTheServerStatusAndBody) {
  BootstrapClient client = Client();
  ASSERT_TRUE(client.RegisterPrefillRank(Rank(0)).ok());
  absl::Status conflict = client.RegisterPrefillRank(Rank(1, 8, 2));
  EXPECT_EQ(conflict.code(), absl::StatusCode::kFailedPrecondition) << conflict;
  EXPECT_NE(conflict.message().find(client.address()), std::string::npos) << conflict;
  EXPECT_NE(conflict.message().find("PUT /route"), std::string::npos) << conflict;
  EXPECT_NE(conflict.message().find("answered 409"), std::string::npos) << conflict;
  EXPECT_NE(conflict.message().find("world_size"), std::string::npos) << conflict;
  absl::Status range = client.RegisterPrefillRank(Rank(7));
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument) << range;
  EXPECT_NE(range.message().find("answered 400"), std::string::npos) << range;
}

// Against kvrail's server (auto, whose sync answer has cache_fields_by_stage) the client
// registers in the 2026-09 form (§12.3); the node then relays a 2026-09 layout.
TEST_F(BootstrapClientTest, RegistersInThe2026FormWithA2026Server) {
  BootstrapClient client = Client();
  layout::Revision form = layout::Revision::kSnapshot;
  ASSERT_TRUE(client.RegisterPrefillRank(Rank(0), &form).ok());
  EXPECT_EQ(form, layout::Revision::k2026_09);
  EXPECT_EQ(server_.registry().Describe().layout_revision, layout::Revision::k2026_09);
  absl::StatusOr<plan::PrefillDescription> description = client.Sync();
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_EQ(description->revision, layout::Revision::k2026_09);
}

// A server pinned to the snapshot (kvrail bootstrap --cachepd-revision snapshot), as the
// snapshot's reference server answers.
class SnapshotServerTest : public ::testing::Test {
 protected:
  static BootstrapServerOptions Options() {
    BootstrapServerOptions options;
    options.cachepd_revision = layout::Revision::kSnapshot;
    return options;
  }
  void SetUp() override { ASSERT_TRUE(server_.Start("127.0.0.1", 0).ok()); }
  BootstrapServer server_{Options()};
};

TEST_F(SnapshotServerTest, RegistersInTheSnapshotFormWithASnapshotServer) {
  BootstrapClient client("127.0.0.1", server_.port(), Quick());
  EXPECT_EQ(*client.ServerRevision(), layout::Revision::kSnapshot);
  layout::Revision form = layout::Revision::k2026_09;
  ASSERT_TRUE(client.RegisterPrefillRank(Rank(0), &form).ok());
  EXPECT_EQ(form, layout::Revision::kSnapshot);
  EXPECT_EQ(server_.registry().Describe().layout_revision, layout::Revision::kSnapshot);
  EXPECT_EQ(server_.registry().Describe().cache_layout, ReferenceLayout());
}

TEST_F(SnapshotServerTest, AShardedContractFailsAtOnceAgainstASnapshotServer) {
  BootstrapClient client("127.0.0.1", server_.port(), Quick());
  PrefillRegistration sharded = Rank(0);
  sharded.contract.group_specs[0].shard_count = 2;
  absl::Status status = client.RegisterPrefillRank(sharded);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("revision mismatch"), std::string::npos) << status;
  EXPECT_NE(status.message().find("shard_count 2"), std::string::npos) << status;
  EXPECT_TRUE(server_.registry().Table().empty());  // no PUT was made
}

TEST(BootstrapClientRevisionTest, TheRevisionIsTheSyncAnswersStageMemberEvenNull) {
  std::string answer;
  ScriptedServer server([&](const httplib::Request&, httplib::Response& res) {
    res.set_content(answer, "application/json");
  });
  BootstrapClient client("127.0.0.1", server.port(), Quick());
  answer = R"({"prefill_tp_size": null, "prefill_dp_size": null, "cache_layout": null})";
  EXPECT_EQ(*client.ServerRevision(), layout::Revision::kSnapshot);
  answer = R"({"prefill_tp_size": null, "prefill_dp_size": null, "prefill_pp_size": 1, )"
           R"("cache_layout": null, "cache_fields_by_stage": null})";
  EXPECT_EQ(*client.ServerRevision(), layout::Revision::k2026_09);
  answer = "[]";
  EXPECT_EQ(client.ServerRevision().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BootstrapClientRevisionTest, APinnedClientRegistersInItsFormWithoutAsking) {
  std::mutex mu;
  std::vector<std::string> seen;
  ScriptedServer server([&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(absl::StrCat(req.method, " ", req.body.empty() ? "" : "body"));
    const json body = json::parse(req.body, nullptr, false);
    if (req.method == "PUT") seen.push_back(body.contains("pp_size") ? "2026-09" : "snapshot");
    res.set_content("OK", "text/plain");
  });
  BootstrapClientOptions options = Quick();
  options.cachepd_revision = layout::Revision::k2026_09;
  layout::Revision form = layout::Revision::kSnapshot;
  ASSERT_TRUE(BootstrapClient("127.0.0.1", server.port(), options)
                  .RegisterPrefillRank(Rank(0), &form)
                  .ok());
  EXPECT_EQ(form, layout::Revision::k2026_09);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"PUT body", "2026-09"}));
}

// A prefill often starts before its node's bootstrap server: the revision's GET waits for it
// within the call's retries, and the registration goes through.
TEST(BootstrapClientRevisionTest, RegistersWithAServerThatComesUpDuringTheRetries) {
  const absl::StatusOr<int> free = kvrail::testing::FreePort();
  ASSERT_TRUE(free.ok()) << free.status();
  const int port = *free;  // nothing listens on it
  BootstrapServer server;
  std::thread late([&server, port] {
    std::this_thread::sleep_for(milliseconds(200));
    ASSERT_TRUE(server.Start("127.0.0.1", port).ok());
  });
  BootstrapClientOptions options = Quick();
  options.retries = 50;
  options.backoff = milliseconds(20);
  options.max_backoff = milliseconds(50);
  layout::Revision form = layout::Revision::kSnapshot;
  absl::Status status =
      BootstrapClient("127.0.0.1", port, options).RegisterPrefillRank(Rank(0), &form);
  late.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(form, layout::Revision::k2026_09);
  EXPECT_EQ(server.registry().Table().size(), 1u);
}

TEST(BootstrapClientTokenTest, RegistersWithTheBearerTokenWhenGivenOne) {
  BootstrapServerOptions server_options;
  server_options.bearer_token = "s3cret.Token";
  BootstrapServer server(server_options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  absl::Status without =
      BootstrapClient("127.0.0.1", server.port(), Quick()).RegisterPrefillRank(Rank(0));
  EXPECT_EQ(without.code(), absl::StatusCode::kUnauthenticated) << without;
  EXPECT_NE(without.message().find("answered 401"), std::string::npos) << without;
  BootstrapClientOptions options = Quick();
  options.bearer_token = "s3cret.Token";
  BootstrapClient client("127.0.0.1", server.port(), options);
  EXPECT_TRUE(client.RegisterPrefillRank(Rank(0)).ok());
  EXPECT_TRUE(client.Sync().ok());  // GETs need no token, and carrying one changes nothing
  EXPECT_TRUE(client.Health().ok());
}

TEST(BootstrapClientTokenTest, SendsTheTokenOnlyWithPuts) {
  std::mutex mu;
  std::vector<std::string> seen;
  ScriptedServer server([&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(absl::StrCat(req.method, " ", req.get_header_value("Authorization")));
    res.set_content(req.method == "PUT" ? "OK" : R"({"rank_ip": "10.0.0.1", "rank_port": 1})",
                    "text/plain");
  });
  BootstrapClientOptions options = Quick();
  options.bearer_token = "abc";
  BootstrapClient client("127.0.0.1", server.port(), options);
  ASSERT_TRUE(client.RegisterPrefillRank(Rank(0)).ok());  // a GET for the revision, the PUT
  ASSERT_TRUE(client.LookupRank(0, 0).ok());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"GET ", "PUT Bearer abc", "GET "}));
}

TEST_F(BootstrapClientTest, SyncGivesUpAtTheDeadlineWhenNoRankRegisters) {
  BootstrapClientOptions options = Quick();
  options.deadline = milliseconds(200);
  BootstrapClient client("127.0.0.1", server_.port(), options);
  absl::Status status = client.Sync().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find(client.address()), std::string::npos) << status;
  EXPECT_NE(status.message().find("engine_rank=-1"), std::string::npos) << status;
  EXPECT_NE(status.message().find("not ready"), std::string::npos) << status;
}

TEST_F(BootstrapClientTest, LookupOfARankThatNeverRegistersGivesUpNamingIt) {
  BootstrapClientOptions options = Quick();
  options.deadline = milliseconds(200);
  ASSERT_TRUE(Client().RegisterPrefillRank(Rank(0)).ok());  // not the call under test
  BootstrapClient client("127.0.0.1", server_.port(), options);
  absl::Status status = client.LookupRank(1, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("prefill rank 1 of dp group 0 is not registered"),
            std::string::npos)
      << status;
}

TEST(BootstrapClientScriptedTest, SyncAsksAgainUntilARankHasRegistered) {
  std::atomic<int> asked{0};
  const std::string layout = ReferenceLayout();
  ScriptedServer server([&](const httplib::Request&, httplib::Response& res) {
    json body = {
        {"prefill_tp_size", nullptr}, {"prefill_dp_size", nullptr}, {"cache_layout", nullptr}};
    if (++asked > 2) {
      body = {{"prefill_tp_size", 2}, {"prefill_dp_size", 1}, {"cache_layout", layout}};
    }
    res.set_content(body.dump(), "application/json");
  });
  BootstrapClient client("127.0.0.1", server.port(), Quick());
  absl::StatusOr<plan::PrefillDescription> description = client.Sync();
  ASSERT_TRUE(description.ok()) << description.status();
  EXPECT_EQ(description->world_size, 2);
  EXPECT_EQ(asked.load(), 3);
}

TEST(BootstrapClientScriptedTest, LookupAsksAgainUntilTheRankHasRegistered) {
  std::atomic<int> asked{0};
  ScriptedServer server([&](const httplib::Request&, httplib::Response& res) {
    if (++asked < 3) {
      res.status = 500;
      res.set_content("KeyError", "text/plain");
    } else {
      res.set_content(R"({"rank_ip": "10.0.0.9", "rank_port": 17000})", "application/json");
    }
  });
  BootstrapClient client("127.0.0.1", server.port(), Quick());
  absl::StatusOr<RankEndpoint> endpoint = client.LookupRank(0, 0);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_EQ(*endpoint, (RankEndpoint{"10.0.0.9", 17000}));
}

TEST(BootstrapClientDownTest, AServerThatIsDownFailsAfterTheRetriesWithAClearError) {
  const absl::StatusOr<int> free = kvrail::testing::FreePort();
  ASSERT_TRUE(free.ok()) << free.status();
  const int port = *free;  // nothing listens on it
  BootstrapClient client("127.0.0.1", port, Quick());
  absl::Status status = client.Sync().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find(absl::StrCat("127.0.0.1:", port)), std::string::npos) << status;
  EXPECT_NE(status.message().find("cannot reach the server"), std::string::npos) << status;
  EXPECT_NE(status.message().find("after 3 attempts"), std::string::npos) << status;
  absl::Status health = client.Health();
  EXPECT_EQ(health.code(), absl::StatusCode::kUnavailable) << health;
  EXPECT_NE(health.message().find("after 1 attempt "), std::string::npos) << health;
  EXPECT_FALSE(client.RegisterPrefillRank(Rank(0)).ok());
  EXPECT_FALSE(client.LookupRank(0, 0).ok());
}

TEST(BootstrapClientScriptedTest, AServerThatAnswersTooSlowlyTimesOut) {
  Gate gate;
  std::atomic<int> asked{0};
  {
    ScriptedServer server([&](const httplib::Request&, httplib::Response& res) {
      ++asked;
      gate.Wait();
      res.set_content("OK", "text/plain");
    });
    BootstrapClientOptions options = Quick();
    options.read_timeout = milliseconds(100);
    options.retries = 1;
    BootstrapClient client("127.0.0.1", server.port(), options);
    absl::Status status = client.LookupRank(0, 0).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_NE(status.message().find("no answer within the timeouts"), std::string::npos) << status;
    EXPECT_NE(status.message().find("GET /route?engine_rank=0&target_dp_group=0"),
              std::string::npos)
        << status;
    EXPECT_EQ(asked.load(), 2);  // the first attempt and one retry
    gate.Open();
  }
}

// The deadline cuts the last attempt's timeouts short: the server's earlier answer ("not
// ready") stays the reason, not the cut attempt's timeout (CI saw the second at random).
TEST(BootstrapClientScriptedTest, AnAttemptTheDeadlineCutsShortKeepsTheServersLastAnswer) {
  Gate gate;
  std::atomic<int> asked{0};
  {
    ScriptedServer server([&](const httplib::Request&, httplib::Response& res) {
      if (++asked > 1) gate.Wait();  // every later attempt finds a server too slow in time
      res.set_content(R"({"prefill_tp_size": null, "prefill_dp_size": null, "cache_layout": null})",
                      "application/json");
    });
    BootstrapClientOptions options = Quick();  // timeouts of 500 ms
    options.deadline = milliseconds(200);
    BootstrapClient client("127.0.0.1", server.port(), options);
    absl::Status status = client.Sync().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_NE(status.message().find("not ready"), std::string::npos) << status;
    EXPECT_EQ(status.message().find("no answer within the timeouts"), std::string::npos) << status;
    gate.Open();
  }
}

TEST(BootstrapClientScriptedTest, BadBodiesFailAtOnceNamingTheBody) {
  ScriptedServer server([](const httplib::Request& req, httplib::Response& res) {
    if (req.get_param_value("engine_rank") == "-1") {
      res.set_content("<html>not json</html>", "text/html");
    } else {
      res.set_content(R"({"rank_ip": 5, "rank_port": 17000})", "application/json");
    }
  });
  BootstrapClient client("127.0.0.1", server.port(), Quick());
  absl::Status sync = client.Sync().status();
  EXPECT_EQ(sync.code(), absl::StatusCode::kInvalidArgument) << sync;
  EXPECT_NE(sync.message().find("<html>not json</html>"), std::string::npos) << sync;
  EXPECT_NE(sync.message().find(client.address()), std::string::npos) << sync;
  absl::Status lookup = client.LookupRank(0, 0).status();
  EXPECT_EQ(lookup.code(), absl::StatusCode::kInvalidArgument) << lookup;
  EXPECT_NE(lookup.message().find("rank_ip"), std::string::npos) << lookup;
}

TEST(BootstrapClientScriptedTest, ANonPagedPrefillIsReportedAsSuch) {
  ScriptedServer server([](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"prefill_tp_size": 2, "prefill_dp_size": 1})", "application/json");
  });
  BootstrapClient client("127.0.0.1", server.port(), Quick());
  absl::Status sync = client.Sync().status();
  EXPECT_FALSE(sync.ok());
  EXPECT_NE(sync.message().find("cache_layout"), std::string::npos) << sync;
}

}  // namespace
}  // namespace kvrail::bootstrap
