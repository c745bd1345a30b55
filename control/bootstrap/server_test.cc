#include "control/bootstrap/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/python_json.h"
#include "control/layout/revision.h"
#include "control/plan/prefill_description.h"
#include "tests/support/vectors.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::json;

struct Reply {
  int status = 0;
  std::string content_type;
  std::string body;
};

std::string PercentEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

Reply Send(int port, const std::string& method, const std::string& path,
           const std::map<std::string, std::string>& query = {}, const std::string& body = "") {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(10, 0);
  httplib::Request request;
  request.method = method;
  request.path = path;
  std::string separator = "?";
  for (const auto& [key, value] : query) {
    absl::StrAppend(&request.path, separator, PercentEncode(key), "=", PercentEncode(value));
    separator = "&";
  }
  if (!body.empty()) {
    request.body = body;
    request.set_header("Content-Type", "application/json");
  }
  httplib::Result result = client.send(request);
  if (!result) {
    ADD_FAILURE() << method << " " << request.path << ": " << httplib::to_string(result.error());
    return {};
  }
  return {result->status, result->get_header_value("Content-Type"), result->body};
}

// The contract every rank of the reference scenario registers (bootstrap.json).
std::string ReferenceLayout() {
  static const std::string* const layout = new std::string(
      kvrail::testing::LoadVectors(
          "bootstrap.json")["scenarios"][0]["exchanges"][2]["json_body"]["cache_layout"]
          .get<std::string>());
  return *layout;
}

json Registration(int engine_rank, int world_size = 4, int dp_size = 2) {
  return {{"role", "Prefill"},
          {"world_size", world_size},
          {"dp_size", dp_size},
          {"rank_ip", absl::StrCat("10.2.0.", engine_rank)},
          {"rank_port", 18000 + engine_rank},
          {"engine_rank", engine_rank},
          {"cache_layout", ReferenceLayout()}};
}

// What a scenario's sync answers should read: the vector's own (`expected`), or, for the
// snapshot's vectors against a server answering in the 2026-09 form, the same answer with
// prefill_pp_size and cache_fields_by_stage in their places (§12.4).
using SyncForm = std::function<std::string(const std::string& expected)>;

std::string AsVectorSays(const std::string& expected) { return expected; }

// The snapshot's sync answer in 2026-09's form: prefill_pp_size 1 after prefill_dp_size, and
// after cache_layout one stage holding every field in plan order (null before any PUT).
std::string In2026Form(const std::string& snapshot_answer) {
  const nlohmann::ordered_json answer = nlohmann::ordered_json::parse(snapshot_answer);
  nlohmann::ordered_json out;
  out["prefill_tp_size"] = answer["prefill_tp_size"];
  out["prefill_dp_size"] = answer["prefill_dp_size"];
  out["prefill_pp_size"] = 1;
  out["cache_layout"] = answer["cache_layout"];
  out["cache_fields_by_stage"] = nullptr;
  if (answer["cache_layout"].is_string()) {
    nlohmann::ordered_json stage = nlohmann::ordered_json::array();
    const json contract = json::parse(answer["cache_layout"].get<std::string>());
    for (const auto& field : contract["plan"]["fields"]) {
      stage.push_back(field["field_id"].get<std::string>());
    }
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    stages.push_back(std::move(stage));
    out["cache_fields_by_stage"] = std::move(stages);
  }
  return DumpPythonJson(out);
}

bool IsSync(const json& exchange) {
  return exchange["method"] == "GET" && exchange["query"].value("engine_rank", "") == "-1" &&
         exchange["query"].value("target_dp_group", "") == "-1";
}

// Replays `scenario` (bootstrap.json, r2/bootstrap_r2.json) against a fresh server with
// `options`: status, content type and body of every exchange, and the final table. Where the
// reference raised (500), kvrail's body is one line; with `same_words`, it holds the
// reference's message (or, for a KeyError, the missing member's name).
void ReplayScenario(const json& scenario, const BootstrapServerOptions& options,
                    const SyncForm& sync_form, bool same_words = false) {
  SCOPED_TRACE(scenario["name"].get<std::string>());
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  int index = 0;
  for (const json& exchange : scenario["exchanges"]) {
    SCOPED_TRACE(absl::StrCat("exchange ", index++, ": ", exchange["method"].get<std::string>(),
                              " ", exchange["path"].get<std::string>()));
    std::map<std::string, std::string> query;
    for (const auto& [key, value] : exchange["query"].items()) query[key] = value;
    const std::string body = exchange["json_body"].is_null() ? "" : exchange["json_body"].dump();
    const Reply reply = Send(server.port(), exchange["method"], exchange["path"], query, body);
    const json& expected = exchange["response"];
    EXPECT_EQ(reply.status, expected["status"].get<int>()) << reply.body;
    if (expected.contains("handler_exception")) {
      // The reference raised; aiohttp's 500 body is its own. kvrail says why in one line.
      EXPECT_EQ(reply.content_type, "text/plain");
      EXPECT_FALSE(reply.body.empty());
      EXPECT_EQ(reply.body.find('\n'), std::string::npos) << reply.body;
      const json& raised = expected["handler_exception"];
      std::string says = raised["message"].get<std::string>();
      if (raised["class"] == "KeyError") says = says.substr(1, says.size() - 2);  // 'member'
      if (same_words) EXPECT_NE(reply.body.find(says), std::string::npos) << reply.body;
    } else {
      EXPECT_EQ(reply.content_type, expected["content_type"].get<std::string>());
      const std::string want = expected["body"].get<std::string>();
      EXPECT_EQ(reply.body, IsSync(exchange) ? sync_form(want) : want);
    }
  }
  RouteTable expected_table;
  for (const auto& [group, ranks] : scenario["final_table"].items()) {
    for (const auto& [rank, endpoint] : ranks.items()) {
      expected_table[std::stoi(group)][std::stoi(rank)] =
          RankEndpoint{endpoint["rank_ip"], endpoint["rank_port"]};
    }
  }
  EXPECT_TRUE(server.registry().Table() == expected_table);
  if (scenario.contains("final_pp_size")) {
    EXPECT_EQ(server.SyncAnswer()["prefill_pp_size"].get<int>(),
              scenario["final_pp_size"].get<int>());
  }
}

BootstrapServerOptions Pinned(layout::Revision revision) {
  BootstrapServerOptions options;
  options.cachepd_revision = revision;
  return options;
}

// Every scenario of bootstrap.json against a server pinned to the snapshot: the snapshot
// reference's answers byte for byte.
TEST(BootstrapServerVectorsTest, PinnedToTheSnapshotReplaysEverySnapshotScenarioExactly) {
  const json vectors = kvrail::testing::LoadVectors("bootstrap.json");
  ASSERT_EQ(vectors["format"], "cachepd-bootstrap-v1");
  ASSERT_GE(vectors["scenarios"].size(), 2u);
  for (const json& scenario : vectors["scenarios"]) {
    ReplayScenario(scenario, Pinned(layout::Revision::kSnapshot), AsVectorSays);
  }
}

// The same against the default server (auto): the same answers, except that every sync
// answer is 2026-09's (§12.4), which a snapshot decode reads as the snapshot's (§2.3).
TEST(BootstrapServerVectorsTest, AutoReplaysEverySnapshotScenarioWithThe2026SyncAnswer) {
  const json vectors = kvrail::testing::LoadVectors("bootstrap.json");
  for (const json& scenario : vectors["scenarios"]) {
    ReplayScenario(scenario, BootstrapServerOptions{}, In2026Form);
  }
}

// Every scenario of r2/bootstrap_r2.json against a server pinned to 2026-09: the newer
// reference's answers byte for byte, its refusals of snapshot-era registrations included.
TEST(BootstrapServerVectorsTest, PinnedTo2026ReplaysEvery2026ScenarioExactly) {
  const json vectors = kvrail::testing::LoadVectors("r2/bootstrap_r2.json");
  ASSERT_EQ(vectors["format"], "cachepd-bootstrap-r2");
  ASSERT_GE(vectors["scenarios"].size(), 2u);
  for (const json& scenario : vectors["scenarios"]) {
    ReplayScenario(scenario, Pinned(layout::Revision::k2026_09), AsVectorSays,
                   /*same_words=*/true);
  }
}

// The r2 scenario in which the reference refuses a snapshot-form contract, which kvrail (auto)
// accepts since it can (§12.11): AutoAcceptsWhatTheNewerReferenceRefusesAsSnapshotEra. (A
// body without a placement but with a 2026-09-form contract, snapshot_era_put, is refused by
// both: that contract's form requires the placement.)
bool SnapshotEraScenario(const json& scenario) {
  return scenario["name"] == "snapshot_form_contract";
}

TEST(BootstrapServerVectorsTest, AutoReplaysEvery2026ScenarioButTheSnapshotEraOnes) {
  const json vectors = kvrail::testing::LoadVectors("r2/bootstrap_r2.json");
  int skipped = 0;
  for (const json& scenario : vectors["scenarios"]) {
    if (SnapshotEraScenario(scenario)) {
      ++skipped;
      continue;
    }
    ReplayScenario(scenario, BootstrapServerOptions{}, AsVectorSays, /*same_words=*/true);
  }
  EXPECT_EQ(skipped, 1);
}

TEST(BootstrapServerVectorsTest, AutoAcceptsWhatTheNewerReferenceRefusesAsSnapshotEra) {
  const json vectors = kvrail::testing::LoadVectors("r2/bootstrap_r2.json");
  for (const json& scenario : vectors["scenarios"]) {
    if (!SnapshotEraScenario(scenario)) continue;
    SCOPED_TRACE(scenario["name"].get<std::string>());
    BootstrapServer server;
    ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
    const json& put = scenario["exchanges"][0];
    ASSERT_EQ(put["method"], "PUT");
    const Reply reply = Send(server.port(), "PUT", "/route", {}, put["json_body"].dump());
    EXPECT_EQ(reply.status, 200) << reply.body;
    EXPECT_EQ(server.registry().Table().size(), 1u);
    const json answer = json::parse(DumpPythonJson(server.SyncAnswer()));
    // The layout is relayed in the form it was registered in.
    absl::StatusOr<layout::Contract> relayed =
        layout::ParseContract(answer["cache_layout"].get<std::string>());
    ASSERT_TRUE(relayed.ok()) << relayed.status();
    absl::StatusOr<layout::Contract> sent =
        layout::ParseContract(put["json_body"]["cache_layout"].get<std::string>());
    ASSERT_TRUE(sent.ok()) << sent.status();
    EXPECT_EQ(relayed->revision, sent->revision);
  }
}

class BootstrapServerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.Start("127.0.0.1", 0).ok()); }

  Reply Put(const json& body) { return Send(server_.port(), "PUT", "/route", {}, body.dump()); }
  Reply PutText(const std::string& body) { return Send(server_.port(), "PUT", "/route", {}, body); }
  Reply Get(const std::string& path, const std::map<std::string, std::string>& query = {}) {
    return Send(server_.port(), "GET", path, query);
  }
  Reply Sync() { return Get("/route", {{"engine_rank", "-1"}, {"target_dp_group", "-1"}}); }

  BootstrapServer server_;
};

TEST_F(BootstrapServerTest, HealthAnswersOkToGetAndHead) {
  Reply get = Get("/health");
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.content_type, "text/plain");
  EXPECT_EQ(get.body, "OK");
  Reply head = Send(server_.port(), "HEAD", "/health");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(Send(server_.port(), "POST", "/health").status, 405);
}

TEST_F(BootstrapServerTest, RouteAnswersEveryOtherMethodWith405) {
  for (const char* method : {"POST", "DELETE", "PATCH", "OPTIONS", "HEAD"}) {
    SCOPED_TRACE(method);
    Reply reply = Send(server_.port(), method, "/route", {}, method[0] == 'P' ? "{}" : "");
    EXPECT_EQ(reply.status, 405);
    if (std::string(method) != "HEAD") {
      EXPECT_EQ(reply.content_type, "application/json");
      EXPECT_EQ(reply.body, "Method not allowed");
    }
  }
}

// One request written by hand (no Content-Length, methods httplib's client does not send);
// returns the status line.
std::string RawStatusLine(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string reply;
  char buffer[4096];
  while (reply.find("\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply.substr(0, reply.find("\r\n"));
}

TEST_F(BootstrapServerTest, MethodsAreRefusedBeforeAnyBodyIsRead) {
  EXPECT_EQ(RawStatusLine(server_.port(), "POST /route HTTP/1.1\r\nHost: x\r\n\r\n"),
            "HTTP/1.1 405 Method Not Allowed");
  EXPECT_EQ(RawStatusLine(server_.port(), "TRACE /route HTTP/1.1\r\nHost: x\r\n\r\n"),
            "HTTP/1.1 405 Method Not Allowed");
  // A refused body on a kept-alive connection is never parsed as the next request.
  httplib::Client client("127.0.0.1", server_.port());
  client.set_keep_alive(true);
  httplib::Result post = client.Post("/route", std::string(100000, '{'), "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "OK");
}

TEST_F(BootstrapServerTest, UnknownPathsAre404) {
  EXPECT_EQ(Get("/routes").status, 404);
  EXPECT_EQ(Send(server_.port(), "PUT", "/nothing", {}, "{}").status, 404);
}

TEST_F(BootstrapServerTest, SyncIsAllNullUntilTheFirstRegistration) {
  Reply reply = Sync();
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body,
            R"({"prefill_tp_size": null, "prefill_dp_size": null, "prefill_pp_size": 1, )"
            R"("cache_layout": null, "cache_fields_by_stage": null})");
  ASSERT_EQ(Put(Registration(3)).status, 200);
  json sync = json::parse(Sync().body);
  EXPECT_EQ(sync["prefill_tp_size"], 4);
  EXPECT_EQ(sync["prefill_dp_size"], 2);
  EXPECT_EQ(sync["prefill_pp_size"], 1);
  EXPECT_EQ(sync["cache_layout"], ReferenceLayout());  // in the form it was registered in
  // A registration without a placement: one stage holding every field, in plan order (§12.4).
  EXPECT_EQ(sync["cache_fields_by_stage"],
            json::array({{"layer.0.k", "layer.0.latent", "layer.1.conv"}}));
  EXPECT_EQ(sync.size(), 5u);
}

TEST_F(BootstrapServerTest, LookupFilesRanksByDpGroup) {
  for (int rank : {0, 1, 2, 3}) ASSERT_EQ(Put(Registration(rank)).status, 200);
  Reply reply = Get("/route", {{"engine_rank", "0"}, {"target_dp_group", "1"}});
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.content_type, "application/json");
  EXPECT_EQ(reply.body, R"({"rank_ip": "10.2.0.2", "rank_port": 18002})");
  // Python int() text: whitespace and a sign are read.
  EXPECT_EQ(Get("/route", {{"engine_rank", " +1 "}, {"target_dp_group", "0"}}).body,
            R"({"rank_ip": "10.2.0.1", "rank_port": 18001})");
}

TEST_F(BootstrapServerTest, LookupOfAnUnknownOrUnreadableRankIs500NamingIt) {
  ASSERT_EQ(Put(Registration(0)).status, 200);
  Reply unknown = Get("/route", {{"engine_rank", "1"}, {"target_dp_group", "0"}});
  EXPECT_EQ(unknown.status, 500);
  EXPECT_NE(unknown.body.find("prefill rank 1 of dp group 0"), std::string::npos) << unknown.body;
  Reply group = Get("/route", {{"engine_rank", "0"}, {"target_dp_group", "7"}});
  EXPECT_EQ(group.status, 500);
  EXPECT_NE(group.body.find("dp group 7"), std::string::npos) << group.body;
  Reply half = Get("/route", {{"engine_rank", "-1"}, {"target_dp_group", "0"}});
  EXPECT_EQ(half.status, 500);
  Reply text = Get("/route", {{"engine_rank", "0"}, {"target_dp_group", "0x1"}});
  EXPECT_EQ(text.status, 500);
  EXPECT_NE(text.body.find("target_dp_group"), std::string::npos) << text.body;
  EXPECT_EQ(Get("/route", {{"engine_rank", ""}, {"target_dp_group", "0"}}).status, 400);
  EXPECT_EQ(Get("/route").body, "Missing inputs for bootstrap server.");
}

TEST_F(BootstrapServerTest, RegisteringTheSameEndpointAgainChangesNothing) {
  ASSERT_EQ(Put(Registration(1)).status, 200);
  ASSERT_EQ(Put(Registration(1)).status, 200);
  RouteTable table = server_.registry().Table();
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table[0].size(), 1u);
}

TEST_F(BootstrapServerTest, ARankRestartingOnItsHostReplacesItsEndpoint) {
  json first = Registration(1);
  first["rank_ip"] = "127.0.0.1";  // the host these requests come from
  ASSERT_EQ(Put(first).status, 200);
  json again = first;
  again["rank_port"] = "19001";  // a numeric string, as int() reads it (§2.1)
  ASSERT_EQ(Put(again).status, 200);
  EXPECT_EQ(Get("/route", {{"engine_rank", "1"}, {"target_dp_group", "0"}}).body,
            R"({"rank_ip": "127.0.0.1", "rank_port": 19001})");
}

TEST_F(BootstrapServerTest, AnotherEndpointForARegisteredRankFromElsewhereIs409NamingIt) {
  ASSERT_EQ(Put(Registration(0)).status, 200);  // rank 0 at 10.2.0.0:18000
  json hijack = Registration(0);
  hijack["rank_ip"] = "10.9.9.9";
  Reply reply = Put(hijack);
  EXPECT_EQ(reply.status, 409);
  EXPECT_EQ(reply.content_type, "text/plain");
  EXPECT_NE(reply.body.find("rank 0 of dp group 0 is registered at 10.2.0.0:18000"),
            std::string::npos)
      << reply.body;
  EXPECT_NE(reply.body.find("from 127.0.0.1"), std::string::npos) << reply.body;
  EXPECT_EQ(reply.body.find('\n'), std::string::npos);
  EXPECT_EQ(Get("/route", {{"engine_rank", "0"}, {"target_dp_group", "0"}}).body,
            R"({"rank_ip": "10.2.0.0", "rank_port": 18000})");
  EXPECT_EQ(Put(Registration(0)).status, 200);  // the same endpoint again is still fine (§2.1)
}

TEST_F(BootstrapServerTest, LayoutsAreComparedInCanonicalForm) {
  json pretty = Registration(0);
  pretty["cache_layout"] = json::parse(ReferenceLayout()).dump(2);
  ASSERT_EQ(Put(pretty).status, 200);
  ASSERT_EQ(Put(Registration(1)).status, 200);  // compact, same canonical form
  EXPECT_EQ(json::parse(Sync().body)["cache_layout"], ReferenceLayout());

  json other = Registration(2);
  json contract = json::parse(ReferenceLayout());
  contract["plan"]["num_lcm_blocks"] = 6;  // another arena geometry: not identical
  other["cache_layout"] = contract.dump();
  Reply reply = Put(other);
  EXPECT_EQ(reply.status, 500);
  EXPECT_NE(reply.body.find("incompatible layouts"), std::string::npos) << reply.body;
  EXPECT_EQ(server_.registry().Table().count(1), 0u);  // nothing recorded
}

TEST_F(BootstrapServerTest, MalformedRegistrationsAre500LikeTheReference) {
  struct Case {
    const char* name;
    std::string body;
    const char* names;  // the member the error must name
  };
  auto without = [](const char* member) {
    json body = Registration(0);
    body.erase(member);
    return body.dump();
  };
  auto with = [](const char* member, json value) {
    json body = Registration(0);
    body[member] = std::move(value);
    return body.dump();
  };
  const Case cases[] = {
      {"not json", "{\"role\": ", "body"},
      {"not an object", "[1, 2]", "body"},
      {"empty", "", "body"},
      {"no role", without("role"), "role"},
      {"no world_size", without("world_size"), "world_size"},
      {"no dp_size", without("dp_size"), "dp_size"},
      {"no rank_ip", without("rank_ip"), "rank_ip"},
      {"no rank_port", without("rank_port"), "rank_port"},
      {"no engine_rank", without("engine_rank"), "engine_rank"},
      {"no cache_layout", without("cache_layout"), "cache_layout"},
      {"world_size string", with("world_size", "4"), "world_size"},
      {"rank_port text", with("rank_port", "18_0x"), "rank_port"},
      {"engine_rank null", with("engine_rank", nullptr), "engine_rank"},
      {"layout not a contract", with("cache_layout", "{}"), "cache_layout"},
      {"layout non-ascii", with("cache_layout", "{\"plan\": \"\xc3\xb6\"}"), "cache_layout"},
      {"dp_size zero", with("dp_size", 0), "dp_size"},
      {"world smaller than dp", with("world_size", 1), "world_size"},
      {"deep nesting", std::string(5000, '[') + std::string(5000, ']'), "body"},
      // §12.3 step 3: pp_size makes it a placement, and the placement is missing.
      {"pp without placement", with("pp_size", 2), "cache_fields_by_stage"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Reply reply = PutText(c.body);
    EXPECT_EQ(reply.status, 500) << reply.body;
    EXPECT_EQ(reply.content_type, "text/plain");
    EXPECT_NE(reply.body.find(c.names), std::string::npos) << reply.body;
  }
  EXPECT_TRUE(server_.registry().Table().empty());
  EXPECT_FALSE(server_.registry().Describe().world_size.has_value());
}

TEST_F(BootstrapServerTest, WhatTheReferenceNeverChecksIs400NamingTheRule) {
  auto with = [](const char* member, json value) {
    json body = Registration(0);
    body[member] = std::move(value);
    return body;
  };
  struct Case {
    const char* name;
    json body;
    const char* names;
  };
  const Case cases[] = {
      {"rank beyond the world", with("engine_rank", 4), "engine_rank"},
      {"negative rank", with("engine_rank", -1), "engine_rank"},
      {"port zero", with("rank_port", 0), "rank_port"},
      {"port too large", with("rank_port", 70000), "rank_port"},
      {"float port", with("rank_port", 18000.5), "rank_port"},
      {"bool rank", with("engine_rank", true), "engine_rank"},
      {"world not a multiple of dp", with("world_size", 5), "world_size"},
      {"negative world", with("world_size", -4), "world_size"},
      {"most negative world", with("world_size", std::numeric_limits<int64_t>::min()),
       "world_size"},
      {"negative dp", with("dp_size", -1), "dp_size"},
      {"empty rank_ip", with("rank_ip", ""), "rank_ip"},
      {"rank_ip not a string", with("rank_ip", 10), "rank_ip"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Reply reply = Put(c.body);
    EXPECT_EQ(reply.status, 400) << reply.body;
    EXPECT_NE(reply.body.find(c.names), std::string::npos) << reply.body;
  }
  EXPECT_TRUE(server_.registry().Table().empty());
}

TEST_F(BootstrapServerTest, RanksThatDisagreeWithTheFirstRegistrationAre409) {
  ASSERT_EQ(Put(Registration(0)).status, 200);
  Reply world = Put(Registration(1, /*world_size=*/8, /*dp_size=*/2));
  EXPECT_EQ(world.status, 409);
  EXPECT_NE(world.body.find("world_size: 8 differs"), std::string::npos) << world.body;
  Reply dp = Put(Registration(1, /*world_size=*/4, /*dp_size=*/4));
  EXPECT_EQ(dp.status, 409);
  EXPECT_NE(dp.body.find("dp_size"), std::string::npos) << dp.body;
  EXPECT_EQ(server_.registry().Table()[0].size(), 1u);
}

TEST_F(BootstrapServerTest, OtherRolesAreCheckedButNotFiled) {
  json decode = Registration(0);
  decode["role"] = "Decode";
  EXPECT_EQ(Put(decode).status, 200);
  EXPECT_TRUE(server_.registry().Table().empty());
  EXPECT_EQ(json::parse(Sync().body)["prefill_tp_size"], 4);  // the first PUT sets the sizes
}

TEST_F(BootstrapServerTest, APipelinedNodeDescribesItsStages) {
  const json stages = {{"layer.0.k", "layer.0.latent"}, {"layer.1.conv"}};
  for (int rank = 0; rank < 8; ++rank) {
    json body = Registration(rank, /*world_size=*/8, /*dp_size=*/2);
    body["pp_size"] = 2;
    body["cache_fields_by_stage"] = stages;
    ASSERT_EQ(Put(body).status, 200) << rank;
  }
  Reply sync = Sync();
  json description = json::parse(sync.body);
  EXPECT_EQ(description["prefill_pp_size"], 2);
  EXPECT_EQ(description["cache_fields_by_stage"], stages);
  absl::StatusOr<plan::PrefillDescription> parsed = plan::ParsePrefillDescription(sync.body);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->pp_size, 2);
  EXPECT_EQ(parsed->stage_tp_size, 2);
  // Global rank 7 is DP group 1, stage 1, TP rank 1: index 3 within its group.
  EXPECT_EQ(Get("/route", {{"engine_rank", "3"}, {"target_dp_group", "1"}}).body,
            R"({"rank_ip": "10.2.0.7", "rank_port": 18007})");

  json moved = Registration(0, 8, 2);
  moved["pp_size"] = 2;
  moved["cache_fields_by_stage"] = {{"layer.0.k"}, {"layer.0.latent", "layer.1.conv"}};
  Reply conflict = Put(moved);
  EXPECT_EQ(conflict.status, 500);  // §12.3 step 6: the newer reference raises
  EXPECT_NE(conflict.body.find("incompatible field placement"), std::string::npos) << conflict.body;

  json unplaced = Registration(0, 8, 2);
  unplaced["pp_size"] = 2;
  unplaced["cache_fields_by_stage"] = {{"layer.0.k"}, {"layer.1.conv"}};  // latent nowhere
  Reply missing = Put(unplaced);
  EXPECT_EQ(missing.status, 500);  // §12.3 step 4
  EXPECT_NE(missing.body.find("layer.0.latent"), std::string::npos) << missing.body;
}

// Older kvrail prefills send their former sharding declaration; ranks that differ in it are all
// filed, and the sync answer does not relay it (the contract's shard_count declares sharding,
// CACHEPD §12.8).
TEST_F(BootstrapServerTest, AnOlderKvrailPrefillsShardingDeclarationIsNeitherComparedNorRelayed) {
  for (int rank = 0; rank < 4; ++rank) {
    json body = Registration(rank);
    body["cache_sharded_groups"] = {{{"group_id", "history"}, {"owners", 1 + rank % 2}}};
    ASSERT_EQ(Put(body).status, 200) << rank;
  }
  EXPECT_EQ(server_.registry().Table().size(), 2u);
  json description = json::parse(Sync().body);
  EXPECT_FALSE(description.contains("cache_sharded_groups")) << description;
}

// The r2 vectors' contract (2026-09 form) and the same contract in the snapshot's form.
std::string Layout2026() {
  return kvrail::testing::LoadVectors("r2/bootstrap_r2.json")["contract_used"].get<std::string>();
}

std::string SnapshotFormOf(const std::string& wire) {
  return *layout::SerializeContract(*layout::ParseContract(wire), layout::Revision::kSnapshot);
}

// A registration of rank `engine_rank` of a one-stage node of two ranks, with `layout`, and
// the 2026-09 members when `with_placement`.
json Registration2026(int engine_rank, const std::string& layout, bool with_placement) {
  json body = {{"role", "Prefill"},
               {"world_size", 2},
               {"dp_size", 1},
               {"rank_ip", absl::StrCat("10.2.0.", engine_rank)},
               {"rank_port", 18000 + engine_rank},
               {"engine_rank", engine_rank},
               {"cache_layout", layout}};
  if (with_placement) {
    body["pp_size"] = 1;
    body["cache_fields_by_stage"] = {
        {"layer.0.k", "layer.1.k", "layer.0.latent", "layer.1.latent"}};
  }
  return body;
}

// A node mid-upgrade: one rank still registers the snapshot's form, the next the 2026-09 form
// of the same contract. They agree; the sync relays the first one's form (§12.4).
TEST_F(BootstrapServerTest, ASnapshotFormThenA2026FormOfOneContractAgree) {
  ASSERT_EQ(Put(Registration2026(0, SnapshotFormOf(Layout2026()), false)).status, 200);
  Reply second = Put(Registration2026(1, Layout2026(), true));
  EXPECT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(server_.registry().Table()[0].size(), 2u);
  const json sync = json::parse(Sync().body);
  EXPECT_EQ(sync["cache_layout"], SnapshotFormOf(Layout2026()));
  EXPECT_EQ(server_.registry().Describe().layout_revision, layout::Revision::kSnapshot);
}

TEST_F(BootstrapServerTest, A2026FormThenASnapshotFormOfOneContractAgree) {
  ASSERT_EQ(Put(Registration2026(0, Layout2026(), true)).status, 200);
  Reply second = Put(Registration2026(1, SnapshotFormOf(Layout2026()), false));
  EXPECT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(json::parse(Sync().body)["cache_layout"], Layout2026());
  EXPECT_EQ(server_.registry().Describe().layout_revision, layout::Revision::k2026_09);
}

TEST_F(BootstrapServerTest, AnotherContractInTheOtherFormIsAnIncompatibleLayout) {
  ASSERT_EQ(Put(Registration2026(0, Layout2026(), true)).status, 200);
  json contract = json::parse(SnapshotFormOf(Layout2026()));
  contract["plan"]["num_lcm_blocks"] = 6;
  Reply reply = Put(Registration2026(1, contract.dump(), false));
  EXPECT_EQ(reply.status, 500);
  EXPECT_NE(reply.body.find("incompatible layouts"), std::string::npos) << reply.body;
  EXPECT_EQ(server_.registry().Table()[0].size(), 1u);
}

TEST_F(BootstrapServerTest, ARegistrationWithoutPlacementMatchesOneStageInAnyOrder) {
  json reordered = Registration2026(0, Layout2026(), true);
  reordered["cache_fields_by_stage"] = {
      {"layer.1.latent", "layer.0.k", "layer.1.k", "layer.0.latent"}};
  ASSERT_EQ(Put(reordered).status, 200);
  EXPECT_EQ(Put(Registration2026(1, SnapshotFormOf(Layout2026()), false)).status, 200);
  // Explicit placements compare as lists, the order within a stage included (§12.3 step 6).
  Reply differs = Put(Registration2026(1, Layout2026(), true));
  EXPECT_EQ(differs.status, 500);
  EXPECT_NE(differs.body.find("incompatible field placement"), std::string::npos) << differs.body;
}

TEST_F(BootstrapServerTest, AFirstRegistrationWithoutPlacementRefusesTwoStages) {
  ASSERT_EQ(Put(Registration2026(0, SnapshotFormOf(Layout2026()), false)).status, 200);
  json staged = Registration2026(1, Layout2026(), true);
  staged["pp_size"] = 2;
  staged["cache_fields_by_stage"] = std::vector<std::vector<std::string>>{
      {"layer.0.k", "layer.0.latent"}, {"layer.1.k", "layer.1.latent"}};
  Reply reply = Put(staged);
  EXPECT_EQ(reply.status, 500);
  EXPECT_NE(reply.body.find("incompatible field placement"), std::string::npos) << reply.body;
}

TEST(BootstrapServerRevisionTest, PinnedToTheSnapshotTheSyncHasItsThreeMembers) {
  BootstrapServer server(Pinned(layout::Revision::kSnapshot));
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  Reply r2 =
      Send(server.port(), "PUT", "/route", {}, Registration2026(0, Layout2026(), true).dump());
  EXPECT_EQ(r2.status, 500);
  EXPECT_NE(r2.body.find("revision mismatch"), std::string::npos) << r2.body;
  ASSERT_EQ(Send(server.port(), "PUT", "/route", {},
                 Registration2026(0, SnapshotFormOf(Layout2026()), false).dump())
                .status,
            200);
  const json sync = json::parse(
      Send(server.port(), "GET", "/route", {{"engine_rank", "-1"}, {"target_dp_group", "-1"}})
          .body);
  EXPECT_EQ(sync.size(), 3u);
  EXPECT_EQ(sync["cache_layout"], SnapshotFormOf(Layout2026()));
}

TEST(BootstrapServerRevisionTest, PinnedTo2026ASnapshotFormContractIsRefused) {
  BootstrapServer server(Pinned(layout::Revision::k2026_09));
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  Reply reply = Send(server.port(), "PUT", "/route", {},
                     Registration2026(0, SnapshotFormOf(Layout2026()), true).dump());
  EXPECT_EQ(reply.status, 500);
  EXPECT_NE(reply.body.find("revision mismatch"), std::string::npos) << reply.body;
  EXPECT_TRUE(server.registry().Table().empty());
}

TEST_F(BootstrapServerTest, ReportsEveryRegistrationOnce) {
  std::mutex mu;
  std::vector<RegistrationEvent> events;
  BootstrapServerOptions options;
  options.on_registration = [&](const RegistrationEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_EQ(Send(server.port(), "PUT", "/route", {}, Registration(2).dump()).status, 200);
  ASSERT_EQ(Send(server.port(), "PUT", "/route", {}, "[]").status, 500);
  server.Stop();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].status.ok());
  EXPECT_EQ(events[0].outcome.dp_group, 1);
  EXPECT_EQ(events[0].outcome.rank_in_group, 0);
  EXPECT_EQ(events[0].outcome.registered_ranks, 1);
  ASSERT_TRUE(events[0].registration.has_value());
  EXPECT_EQ(events[0].registration->endpoint.rank_port, 18002);
  EXPECT_EQ(events[1].http_status, 500);
  EXPECT_FALSE(events[1].status.ok());
}

TEST_F(BootstrapServerTest, ConcurrentRegistrationsAreAllFiled) {
  constexpr int kWorld = 128;  // more than the worker threads and httplib's own backlog
  std::vector<std::thread> threads;
  threads.reserve(kWorld);
  std::atomic<int> accepted{0};
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      if (Send(server_.port(), "PUT", "/route", {}, Registration(rank, kWorld, 4).dump()).status ==
          200) {
        ++accepted;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(accepted.load(), kWorld);
  RouteTable table = server_.registry().Table();
  ASSERT_EQ(table.size(), 4u);
  for (const auto& [group, ranks] : table) EXPECT_EQ(ranks.size(), 32u) << group;
}

// A client that writes bytes by hand, as a hostile peer does.
class RawConnection {
 public:
  explicit RawConnection(int port, const char* source_ip = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (source_ip != nullptr) {
      sockaddr_in source{};
      source.sin_family = AF_INET;
      ::inet_pton(AF_INET, source_ip, &source.sin_addr);
      ::bind(fd_, reinterpret_cast<sockaddr*>(&source), sizeof(source));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  int local_port() const {
    sockaddr_in addr{};
    socklen_t length = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length);
    return ntohs(addr.sin_port);
  }
  bool Send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Reads until `until` appears, the server closes, or nothing arrives for `timeout`.
  // Returns what arrived; closed() says whether the server closed.
  std::string Read(std::chrono::seconds timeout, const std::string& until = "") {
    timeval tv{static_cast<time_t>(timeout.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string out;
    char buffer[4096];
    while (until.empty() || out.find(until) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        closed_ = true;
        break;
      }
      if (n < 0) break;  // timed out
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

// Collects the intake's refusals.
struct RefusalLog {
  std::mutex mu;
  std::vector<RefusalEvent> events;

  std::function<void(const RefusalEvent&)> Callback() {
    return [this](const RefusalEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    };
  }
  size_t Count(RefusalKind kind) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(events.begin(), events.end(),
                         [kind](const RefusalEvent& e) { return e.kind == kind; });
  }
};

Reply SendWithin5s(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  httplib::Result result = client.Get(path.c_str());
  if (!result) return {0, "", httplib::to_string(result.error())};
  return {result->status, result->get_header_value("Content-Type"), result->body};
}

// Issue 12: 300 idle connections, or 20 that trickle a header byte at a time and never finish,
// held every worker and timed /health out for as long as they stayed open.
TEST(BootstrapServerHardeningTest, IdleAndSlowConnectionsDoNotStarveHealthOrLookups) {
  RefusalLog log;
  BootstrapServerOptions options;
  options.request_deadline = std::chrono::milliseconds(4000);
  options.on_refusal = log.Callback();
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_EQ(Send(server.port(), "PUT", "/route", {}, Registration(1).dump()).status, 200);

  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 300; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server.port()));
    ASSERT_TRUE(idle.back()->connected()) << i;
  }
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 20; ++i) {
    slow.push_back(std::make_unique<RawConnection>(server.port()));
    ASSERT_TRUE(slow.back()->Send("GET /health HTTP/1.1\r\nX-Slow: "));
  }
  std::atomic<bool> stop_trickling{false};
  std::thread trickle([&] {
    while (!stop_trickling.load()) {
      for (auto& c : slow) c->Send("a");  // fails quietly once the server has closed it
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });

  Reply health = SendWithin5s(server.port(), "/health");
  EXPECT_EQ(health.status, 200) << health.body;
  EXPECT_EQ(health.body, "OK");
  Reply lookup = SendWithin5s(server.port(), "/route?engine_rank=1&target_dp_group=0");
  EXPECT_EQ(lookup.status, 200) << lookup.body;
  EXPECT_EQ(lookup.body, R"({"rank_ip": "10.2.0.1", "rank_port": 18001})");

  // Every hostile connection is closed by the server at its deadline, the slow ones (which
  // kept sending) with a 408 that names the rule.
  for (auto& c : slow) {
    const std::string answer = c->Read(std::chrono::seconds(30));
    EXPECT_TRUE(c->closed());
    EXPECT_EQ(answer.rfind("HTTP/1.1 408 Request Timeout\r\n", 0), 0u) << answer;
    EXPECT_NE(answer.find("--request-deadline"), std::string::npos) << answer;
  }
  stop_trickling = true;
  trickle.join();
  for (auto& c : idle) {
    c->Read(std::chrono::seconds(30));
    EXPECT_TRUE(c->closed());
  }
  EXPECT_EQ(log.Count(RefusalKind::kDeadline), 320u);
  EXPECT_EQ(SendWithin5s(server.port(), "/health").status, 200);
}

TEST(BootstrapServerHardeningTest, PastTheConnectionLimitTheLongestOpenIdleOneMakesRoom) {
  RefusalLog log;
  BootstrapServerOptions options;
  options.max_connections = 8;
  options.on_refusal = log.Callback();
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server.port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  // A well-behaved request closes the longest-open idle connection to get in.
  Reply health = SendWithin5s(server.port(), "/health");
  EXPECT_EQ(health.status, 200) << health.body;
  EXPECT_EQ(health.body, "OK");
  const std::string answer = idle[0]->Read(std::chrono::seconds(30));
  EXPECT_TRUE(idle[0]->closed());
  EXPECT_EQ(answer.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << answer;
  EXPECT_NE(answer.find("--max-connections"), std::string::npos) << answer;
  std::lock_guard<std::mutex> lock(log.mu);
  ASSERT_FALSE(log.events.empty());
  EXPECT_EQ(log.events[0].kind, RefusalKind::kConnectionLimit);
  EXPECT_EQ(log.events[0].http_status, 503);
  EXPECT_EQ(log.events[0].peer.ip, "127.0.0.1");
  EXPECT_EQ(log.events[0].peer.port, idle[0]->local_port());
}

TEST(BootstrapServerHardeningTest, ABodyOverTheLimitIs413AndReported) {
  RefusalLog log;
  BootstrapServerOptions options;
  options.on_refusal = log.Callback();
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  Reply reply = Send(server.port(), "PUT", "/route", {}, std::string(12 << 20, ' '));
  EXPECT_EQ(reply.status, 413);
  EXPECT_EQ(reply.content_type, "text/plain");
  EXPECT_NE(reply.body.find("Content-Length 12582912 exceeds the 1048576 bytes"), std::string::npos)
      << reply.body;
  EXPECT_EQ(reply.body.find('\n'), std::string::npos);
  ASSERT_EQ(log.Count(RefusalKind::kBodyTooLarge), 1u);
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_EQ(log.events[0].http_status, 413);
  EXPECT_EQ(log.events[0].peer.ip, "127.0.0.1");
  EXPECT_EQ(log.events[0].reason, reply.body);
}

TEST(BootstrapServerHardeningTest, ChunkedAndExpectContinueRegistrationsAreRead) {
  BootstrapServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const std::string body = Registration(2).dump();

  RawConnection expect(server.port());
  ASSERT_TRUE(expect.Send(absl::StrCat("PUT /route HTTP/1.1\r\nHost: x\r\nContent-Length: ",
                                       body.size(), "\r\nExpect: 100-continue\r\n\r\n")));
  EXPECT_EQ(expect.Read(std::chrono::seconds(10), "\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(expect.Send(body));
  const std::string answer = expect.Read(std::chrono::seconds(10));
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;  // one 100, then the answer
  EXPECT_EQ(answer.substr(answer.size() - 4), "\r\nOK");

  RawConnection chunked(server.port());
  ASSERT_TRUE(chunked.Send(
      absl::StrCat("PUT /route HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                   absl::Hex(body.size() / 2), "\r\n", body.substr(0, body.size() / 2), "\r\n",
                   absl::Hex(body.size() - body.size() / 2), "\r\n", body.substr(body.size() / 2),
                   "\r\n0\r\n\r\n")));
  EXPECT_EQ(chunked.Read(std::chrono::seconds(10)).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  EXPECT_EQ(server.registry().Table()[1].size(), 1u);
}

TEST(BootstrapServerHardeningTest, UnreadableRequestsGetAOneLineBody) {
  BootstrapServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  for (const std::string& request :
       {std::string("PUT /route HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
                    "\r\n"),
        std::string("NONSENSE\r\n\r\n")}) {
    RawConnection c(server.port());
    ASSERT_TRUE(c.Send(request));
    const std::string answer = c.Read(std::chrono::seconds(10));
    EXPECT_EQ(answer.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << answer;
    const std::string body = answer.substr(answer.find("\r\n\r\n") + 4);
    EXPECT_NE(body.find("request:"), std::string::npos) << answer;
    EXPECT_EQ(body.find('\n'), std::string::npos) << answer;
  }
}

TEST(BootstrapServerTokenTest, WithATokenEveryPutNeedsTheBearerHeader) {
  std::mutex mu;
  std::vector<RegistrationEvent> events;
  BootstrapServerOptions options;
  options.bearer_token = "s3cret-Token";
  options.on_registration = [&](const RegistrationEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const std::string body = Registration(0).dump();
  auto put = [&](const char* authorization) {
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(10, 0);
    httplib::Headers headers;
    if (authorization != nullptr) headers.emplace("Authorization", authorization);
    return client.Put("/route", headers, body, "application/json");
  };
  for (const char* wrong : {static_cast<const char*>(nullptr), "Bearer s3cret-Tokem",
                            "Basic s3cret-Token", "Bearer s3cret-Token2"}) {
    SCOPED_TRACE(wrong == nullptr ? "none" : wrong);
    httplib::Result refused = put(wrong);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 401);
    EXPECT_EQ(refused->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_EQ(refused->get_header_value("Content-Type"), "text/plain");
    EXPECT_NE(refused->body.find("'Authorization: Bearer <token>'"), std::string::npos)
        << refused->body;
    EXPECT_EQ(refused->body.find("s3cret"), std::string::npos) << refused->body;
    EXPECT_EQ(refused->body.find('\n'), std::string::npos);
  }
  EXPECT_TRUE(server.registry().Table().empty());
  EXPECT_FALSE(server.registry().Describe().world_size.has_value());  // nothing was fixed
  httplib::Result accepted = put("Bearer s3cret-Token");
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 200);
  EXPECT_EQ(accepted->body, "OK");
  // Reading needs no token (decode ranks and heartbeats, CACHEPD §1.6, §2.2).
  EXPECT_EQ(Send(server.port(), "GET", "/health").status, 200);
  EXPECT_EQ(
      Send(server.port(), "GET", "/route", {{"engine_rank", "0"}, {"target_dp_group", "0"}}).status,
      200);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].http_status, 401);
  EXPECT_EQ(events[0].status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(events[0].peer.ip, "127.0.0.1");
  EXPECT_TRUE(events[4].status.ok());
}

TEST(BootstrapServerTokenTest, TheTokenLetsARankMoveToAnotherHost) {
  BootstrapServerOptions options;
  options.bearer_token = "t";
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(10, 0);
  const httplib::Headers token{{"Authorization", "Bearer t"}};
  ASSERT_EQ(client.Put("/route", token, Registration(0).dump(), "application/json")->status, 200);
  json moved = Registration(0);
  moved["rank_ip"] = "10.7.7.7";
  ASSERT_EQ(client.Put("/route", token, moved.dump(), "application/json")->status, 200);
  EXPECT_EQ(server.registry().Lookup(0, 0)->rank_ip, "10.7.7.7");
}

TEST(BootstrapServerTokenTest, AnInvalidTokenFailsToStart) {
  BootstrapServerOptions options;
  options.bearer_token = "has space";
  BootstrapServer server(options);
  EXPECT_EQ(server.Start("127.0.0.1", 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BootstrapServerConfiguredTest, AStrayFirstRegistrationCannotFixTheNodesSizes) {
  BootstrapServerOptions options;
  options.configured.world_size = 4;
  options.configured.dp_size = 2;
  BootstrapServer server(options);
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  Reply stray = Send(server.port(), "PUT", "/route", {}, Registration(0, 8, 4).dump());
  EXPECT_EQ(stray.status, 409);
  EXPECT_NE(stray.body.find("world_size: 8 differs from 4"), std::string::npos) << stray.body;
  EXPECT_NE(stray.body.find("--world-size"), std::string::npos) << stray.body;
  EXPECT_EQ(
      Send(server.port(), "GET", "/route", {{"engine_rank", "-1"}, {"target_dp_group", "-1"}}).body,
      R"({"prefill_tp_size": null, "prefill_dp_size": null, "prefill_pp_size": 1, )"
      R"("cache_layout": null, "cache_fields_by_stage": null})");
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(Send(server.port(), "PUT", "/route", {}, Registration(rank).dump()).status, 200);
  }
  EXPECT_EQ(server.registry().Table().size(), 2u);
}

TEST(BootstrapServerLifecycleTest, ABusyPortFailsToStart) {
  BootstrapServer first;
  ASSERT_TRUE(first.Start("127.0.0.1", 0).ok());
  BootstrapServer second;
  absl::Status status = second.Start("127.0.0.1", first.port());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find(absl::StrCat(first.port())), std::string::npos) << status;
  EXPECT_EQ(first.Start("127.0.0.1", 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BootstrapServerLifecycleTest, StopJoinsWithAKeepAliveConnectionOpen) {
  BootstrapServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", server.port());
  client.set_keep_alive(true);
  ASSERT_TRUE(client.Get("/health"));
  server.Stop();
  server.Stop();  // idempotent
  EXPECT_FALSE(client.Get("/health"));
}

TEST(BootstrapServerLifecycleTest, StopBeforeStartIsHarmless) {
  BootstrapServer server;
  server.Stop();
  EXPECT_EQ(server.port(), 0);
}

}  // namespace
}  // namespace kvrail::bootstrap
