#include "control/bootstrap/registry.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "control/bootstrap/python_json.h"
#include "control/bootstrap/refusal.h"
#include "tests/support/vectors.h"

namespace kvrail::bootstrap {
namespace {

using nlohmann::json;

ParsedRegistration Rank(int engine_rank, int world_size = 4, int dp_size = 2) {
  static const json* const reference = new json(
      kvrail::testing::LoadVectors("bootstrap.json")["scenarios"][0]["exchanges"][2]["json_body"]);
  json body = *reference;
  body["world_size"] = world_size;
  body["dp_size"] = dp_size;
  body["engine_rank"] = engine_rank;
  body["rank_port"] = 18000 + engine_rank;
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(body.dump());
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

TEST(PrefillRegistryTest, DescriptionIsNullUntilTheFirstRegistration) {
  PrefillRegistry registry;
  // §12.4: prefill_pp_size is 1 and cache_fields_by_stage null before any PUT.
  EXPECT_EQ(DumpPythonJson(registry.Describe().ToJson()),
            R"({"prefill_tp_size": null, "prefill_dp_size": null, "prefill_pp_size": 1, )"
            R"("cache_layout": null, "cache_fields_by_stage": null})");
  EXPECT_EQ(DumpPythonJson(registry.Describe().ToJson(layout::Revision::kSnapshot)),
            R"({"prefill_tp_size": null, "prefill_dp_size": null, "cache_layout": null})");
  ASSERT_TRUE(registry.Register(Rank(0)).ok());
  NodeDescription d = registry.Describe();
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.dp_size, 2);
  EXPECT_TRUE(d.cache_layout.has_value());
}

TEST(PrefillRegistryTest, FilesRanksByDpGroupAndReportsReplacements) {
  PrefillRegistry registry;
  absl::StatusOr<RegistrationOutcome> first = registry.Register(Rank(3));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->dp_group, 1);
  EXPECT_EQ(first->rank_in_group, 1);
  EXPECT_FALSE(first->replaced.has_value());
  ParsedRegistration moved = Rank(3);
  moved.registration.endpoint.rank_port = 19003;
  absl::StatusOr<RegistrationOutcome> second =
      registry.Register(moved, Registrant{"10.2.0.0"});  // from the rank's own host
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(second->replaced.has_value());
  EXPECT_EQ(second->replaced->rank_port, 18003);
  EXPECT_EQ(second->registered_ranks, 1);
  EXPECT_EQ(registry.Lookup(1, 1)->rank_port, 19003);
  EXPECT_EQ(HttpStatusOf(registry.Lookup(0, 1).status()), 500);
  EXPECT_EQ(HttpStatusOf(registry.Lookup(int64_t{1} << 40, 1).status()), 500);
}

TEST(PrefillRegistryTest, ARefusedRegistrationRecordsNothing) {
  PrefillRegistry registry;
  ASSERT_TRUE(registry.Register(Rank(0)).ok());
  ParsedRegistration other = Rank(1);
  other.comparable_layout += " ";
  absl::Status status = registry.Register(other).status();
  EXPECT_EQ(HttpStatusOf(status), 500);
  EXPECT_NE(status.message().find("from byte"), std::string::npos) << status;
  EXPECT_EQ(HttpStatusOf(registry.Register(Rank(1, 8, 2)).status()), 409);
  EXPECT_EQ(registry.Table()[0].size(), 1u);
}

TEST(PrefillRegistryTest, AnotherEndpointNeedsTheRanksOwnHostOrTheToken) {
  PrefillRegistry registry;
  ASSERT_TRUE(registry.Register(Rank(1)).ok());  // 10.2.0.0:18001
  ParsedRegistration moved = Rank(1);
  moved.registration.endpoint = RankEndpoint{"10.9.9.9", 18001};
  for (const Registrant& stranger :
       {Registrant{}, Registrant{"10.9.9.9"}, Registrant{"10.2.0.1"}, Registrant{"not-an-ip"}}) {
    absl::Status refused = registry.Register(moved, stranger).status();
    EXPECT_EQ(HttpStatusOf(refused), 409) << stranger.peer_ip;
    EXPECT_NE(refused.message().find("registered at 10.2.0.0:18001"), std::string::npos) << refused;
  }
  EXPECT_EQ(registry.Lookup(1, 0)->rank_ip, "10.2.0.0");
  // The same host written as IPv4-mapped IPv6 is the same host.
  EXPECT_TRUE(registry.Register(moved, Registrant{"::ffff:10.2.0.0"}).ok());
  EXPECT_EQ(registry.Lookup(1, 0)->rank_ip, "10.9.9.9");
  // With the token, from anywhere.
  ParsedRegistration back = Rank(1);
  absl::StatusOr<RegistrationOutcome> outcome =
      registry.Register(back, Registrant{"192.0.2.7", /*has_token=*/true});
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  ASSERT_TRUE(outcome->replaced.has_value());
  EXPECT_EQ(outcome->replaced->rank_ip, "10.9.9.9");
  EXPECT_TRUE(registry.Register(back).ok());  // the same endpoint needs nothing (§2.1)
}

TEST(PrefillRegistryTest, AConfiguredNodeRefusesOtherSizesAndLayoutsFromTheFirstRegistration) {
  ConfiguredNode configured;
  configured.world_size = 4;
  configured.dp_size = 2;
  configured.canonical_layout = Rank(0).comparable_layout;
  PrefillRegistry registry(configured);
  struct Case {
    const char* name;
    ParsedRegistration stray;
    const char* names;
  };
  ParsedRegistration layout = Rank(0);
  layout.comparable_layout += " ";
  const Case cases[] = {
      {"world", Rank(0, 8, 2), "world_size: 8 differs from 4"},
      {"dp", Rank(0, 4, 4), "dp_size: 4 differs from 2"},
      {"layout", layout, "--cache-layout"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::Status status = registry.Register(c.stray).status();
    EXPECT_EQ(HttpStatusOf(status), 409);
    EXPECT_NE(status.message().find(c.names), std::string::npos) << status;
    EXPECT_FALSE(registry.Describe().world_size.has_value());  // the node is unchanged
    EXPECT_TRUE(registry.Table().empty());
  }
  EXPECT_TRUE(registry.Register(Rank(0)).ok());
  EXPECT_EQ(registry.Describe().world_size, 4);
}

TEST(PrefillRegistryTest, IsSafeUnderConcurrentUse) {
  PrefillRegistry registry;
  constexpr int kWorld = 64;
  std::vector<ParsedRegistration> ranks;
  ranks.reserve(kWorld);
  for (int r = 0; r < kWorld; ++r) ranks.push_back(Rank(r, kWorld, 8));
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = t; r < kWorld; r += 4) {
        EXPECT_TRUE(registry.Register(ranks[r]).ok());
        registry.Describe();
        registry.Lookup(r % 8, r / 8).IgnoreError();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  RouteTable table = registry.Table();
  ASSERT_EQ(table.size(), 8u);
  for (const auto& [group, members] : table) EXPECT_EQ(members.size(), 8u);
}

}  // namespace
}  // namespace kvrail::bootstrap
