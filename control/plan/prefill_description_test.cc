#include "control/plan/prefill_description.h"

#include <gtest/gtest.h>

#include <string>

#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

// The reference bootstrap's sync answer once four ranks registered (bootstrap.json).
std::string ReferenceSyncBody() {
  const nlohmann::json vectors = kvrail::testing::LoadVectors("bootstrap.json");
  std::string last;
  for (const auto& exchange : vectors["scenarios"][0]["exchanges"]) {
    if (exchange["method"] == "GET" && exchange["query"].value("engine_rank", "") == "-1" &&
        exchange["response"]["status"] == 200) {
      last = exchange["response"]["body"].get<std::string>();
    }
  }
  return last;
}

TEST(PrefillDescriptionTest, PythonPrefillDefaultsToOneStageAndNoSharding) {
  absl::StatusOr<PrefillDescription> d = ParsePrefillDescription(ReferenceSyncBody());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->dp_size, 2);
  EXPECT_EQ(d->pp_size, 1);
  EXPECT_EQ(d->stage_tp_size, 2);
  ASSERT_EQ(d->pipeline.fields_by_stage.size(), 1u);
  EXPECT_EQ(d->pipeline.fields_by_stage[0].size(), d->contract.plan.fields.size());
  EXPECT_TRUE(d->sharded_groups.empty());
}

TEST(PrefillDescriptionTest, ReadsPipelineStagesAndShardedGroups) {
  nlohmann::json body = nlohmann::json::parse(ReferenceSyncBody());
  body["prefill_tp_size"] = "8 ";  // strings with whitespace are accepted (§10.5)
  body["prefill_pp_size"] = 2;
  body["cache_fields_by_stage"] = {{"layer.0.k", "layer.0.latent"}, {"layer.1.conv"}};
  body["cache_sharded_groups"] = {{{"group_id", "history"}, {"owners", 2}}};
  absl::StatusOr<PrefillDescription> d = ParsePrefillDescription(body.dump());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->stage_tp_size, 2);
  ASSERT_EQ(d->pipeline.fields_by_stage.size(), 2u);
  ASSERT_EQ(d->sharded_groups.size(), 1u);
  EXPECT_EQ(d->sharded_groups[0].owners, 2);
}

TEST(PrefillDescriptionTest, RejectsWhatARustPeerRejects) {
  const nlohmann::json good = nlohmann::json::parse(ReferenceSyncBody());
  auto with = [&good](const char* key, nlohmann::json value) {
    nlohmann::json body = good;
    body[key] = std::move(value);
    return ParsePrefillDescription(body.dump()).status();
  };
  EXPECT_FALSE(with("cache_layout", nullptr).ok());  // a non-paged prefill
  EXPECT_FALSE(with("cache_layout", "{}").ok());
  EXPECT_FALSE(with("cache_layout", "\xc3\xa9").ok());
  EXPECT_FALSE(with("prefill_dp_size", 0).ok());
  EXPECT_FALSE(with("prefill_tp_size", 2.5).ok());
  EXPECT_FALSE(with("prefill_tp_size", "1_0").ok());
  EXPECT_FALSE(with("prefill_pp_size", 2).ok());  // no stage list for two stages
  EXPECT_FALSE(with("cache_fields_by_stage", {{"layer.0.k"}}).ok());  // fields missing
  EXPECT_FALSE(with("cache_sharded_groups", {{{"group_id", "nope"}, {"owners", 2}}}).ok());
  EXPECT_FALSE(ParsePrefillDescription("[]").ok());
  EXPECT_FALSE(ParsePrefillDescription(
                   R"({"prefill_tp_size": null, "prefill_dp_size": null, "cache_layout": null})")
                   .ok());
  absl::Status status = with("prefill_dp_size", 0);
  EXPECT_NE(status.message().find("prefill_dp_size"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace kvrail::plan
