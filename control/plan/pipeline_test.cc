#include "control/plan/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "control/plan/vector_cases.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

using testing::PlannerCase;
using testing::PlannerCases;
using testing::ReadPlannerCase;

bool Mentions(const absl::Status& status, absl::string_view text) {
  return status.message().find(text) != absl::string_view::npos;
}

// Two stages splitting the model's layers: stage 0 holds the first half of the distinct layer
// numbers ("layer.<N>.*"), stage 1 the rest. With a single layer, the fields split in half in
// plan order.
PipelineLayout SplitLayers(const layout::Contract& wire) {
  std::map<std::string, int> layer_of;
  std::set<int> layers;
  for (const layout::FieldLayout& field : wire.plan.fields) {
    std::vector<std::string> parts = absl::StrSplit(field.field_id, '.');
    int layer = 0;
    if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &layer)) {
      layer = 0;
    }
    layer_of[field.field_id] = layer;
    layers.insert(layer);
  }
  std::vector<int> sorted(layers.begin(), layers.end());
  PipelineLayout split;
  split.pp_size = 2;
  split.fields_by_stage.resize(2);
  const size_t n = wire.plan.fields.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string& id = wire.plan.fields[i].field_id;
    int stage;
    if (sorted.size() >= 2) {
      const size_t index =
          std::lower_bound(sorted.begin(), sorted.end(), layer_of[id]) - sorted.begin();
      stage = index < (sorted.size() + 1) / 2 ? 0 : 1;
    } else {
      stage = i < (n + 1) / 2 ? 0 : 1;
    }
    split.fields_by_stage[stage].push_back(id);
  }
  return split;
}

int StageOf(const PipelineLayout& layout, const std::string& field_id) {
  for (int s = 0; s < layout.pp_size; ++s) {
    const auto& ids = layout.fields_by_stage[s];
    if (std::find(ids.begin(), ids.end(), field_id) != ids.end()) {
      return s;
    }
  }
  return -1;
}

// The default layout, one stage holding every field, gives exactly the §6 planner's routes
// and targets on every planner.json case, errors included.
TEST(PipelineTest, DefaultSingleStageIsThePlainPlanner) {
  int routes = 0;
  for (const nlohmann::json& entry : PlannerCases()) {
    const PlannerCase c = ReadPlannerCase(entry);
    SCOPED_TRACE(c.name);
    const PipelineLayout single = PipelineLayout::SingleStage(c.prefill);
    ASSERT_TRUE(ValidatePipelineLayout(single, c.prefill).ok());
    absl::StatusOr<Planner> planner =
        Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode);
    if (!planner.ok()) {
      absl::StatusOr<PipelineRoute> route =
          PlanPipelineRoute(single, c.prefill_tp, c.decode_tp, 0, c.prefill, c.decode);
      ASSERT_FALSE(route.ok());
      EXPECT_EQ(CategoryOf(route.status()), CategoryOf(planner.status()));
      continue;
    }
    for (int d = 0; d < c.decode_tp; ++d) {
      SCOPED_TRACE(absl::StrCat("d=", d));
      absl::StatusOr<Route> plain = planner->PlanForDecodeRank(d);
      absl::StatusOr<PipelineRoute> route =
          PlanPipelineRoute(single, c.prefill_tp, c.decode_tp, d, c.prefill, c.decode);
      if (!plain.ok()) {
        ASSERT_FALSE(route.ok());
        EXPECT_EQ(CategoryOf(route.status()), CategoryOf(plain.status()));
        continue;
      }
      ASSERT_TRUE(route.ok()) << route.status();
      EXPECT_EQ(route->whole_field_copy, plain->whole_field_copy);
      ASSERT_EQ(route->sources.size(), plain->sources.size());
      for (size_t i = 0; i < plain->sources.size(); ++i) {
        EXPECT_EQ(route->sources[i].stage, 0);
        EXPECT_EQ(route->sources[i].stage_tp_rank, plain->sources[i].prefill_rank);
        EXPECT_EQ(route->sources[i].prefill_rank, plain->sources[i].prefill_rank);
        EXPECT_EQ(route->sources[i].fragments, plain->sources[i].fragments);
      }
      EXPECT_EQ(route->targets, *planner->TargetsFor(d));
      ++routes;
    }
  }
  EXPECT_GT(routes, 0);
}

// Splitting the layers over two stages: each stage's prefill rank p sends exactly the plain
// route's fragments of its own fields (in order), under global id stage * P + p; dummies are
// per stage. With P == D each stage routes its fields explicitly and covers every decode byte.
TEST(PipelineTest, TwoStagesSplittingLayersGiveTheUnionOfStageFragments) {
  int split_cases = 0;
  for (const nlohmann::json& entry : PlannerCases()) {
    if (!entry.at("result").at("ok").get<bool>()) {
      continue;
    }
    const PlannerCase c = ReadPlannerCase(entry);
    if (c.prefill.plan.fields.size() < 2) {
      continue;
    }
    SCOPED_TRACE(c.name);
    const int P = c.prefill_tp;
    const PipelineLayout split = SplitLayers(c.prefill);
    ASSERT_TRUE(ValidatePipelineLayout(split, c.prefill).ok());
    ASSERT_FALSE(split.fields_by_stage[0].empty());
    ASSERT_FALSE(split.fields_by_stage[1].empty());
    absl::StatusOr<Planner> planner = Planner::Create(P, c.decode_tp, c.prefill, c.decode);
    ASSERT_TRUE(planner.ok()) << planner.status();
    ++split_cases;

    if (planner->whole_field_copy()) {
      for (int d = 0; d < c.decode_tp; ++d) {
        absl::StatusOr<PipelineRoute> route =
            PlanPipelineRoute(split, P, c.decode_tp, d, c.prefill, c.decode);
        ASSERT_TRUE(route.ok()) << route.status();
        EXPECT_FALSE(route->whole_field_copy);
        std::map<std::string, std::vector<int>> written;
        for (const layout::FieldLayout& field : c.decode.plan.fields) {
          written[field.field_id].assign(layout::PayloadBytes(field), 0);
        }
        for (const PipelineSource& source : route->sources) {
          EXPECT_EQ(source.prefill_rank, source.stage * P + source.stage_tp_rank);
          ASSERT_FALSE(source.fragments.empty());
          for (const Fragment& f : source.fragments) {
            EXPECT_EQ(StageOf(split, f.field_id), source.stage) << f;
            for (int64_t row = 0; row < f.rows_per_page; ++row) {
              for (int64_t i = 0; i < f.bytes_per_row; ++i) {
                ++written[f.field_id].at(f.dst_byte_offset + row * f.dst_row_stride_bytes + i);
              }
            }
          }
        }
        for (const auto& [field_id, bytes] : written) {
          EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](int n) { return n == 1; }))
              << field_id;
        }
      }
      continue;
    }

    // S_p of each stage, derived from the plain routes.
    std::vector<std::vector<std::set<int>>> stage_served(2, std::vector<std::set<int>>(P));
    std::vector<Route> plain_routes;
    for (int d = 0; d < c.decode_tp; ++d) {
      absl::StatusOr<Route> plain = planner->PlanForDecodeRank(d);
      ASSERT_TRUE(plain.ok()) << plain.status();
      for (const SourceFragments& source : plain->sources) {
        for (const Fragment& f : source.fragments) {
          stage_served[StageOf(split, f.field_id)][source.prefill_rank].insert(d);
        }
      }
      plain_routes.push_back(*std::move(plain));
    }
    for (int d = 0; d < c.decode_tp; ++d) {
      SCOPED_TRACE(absl::StrCat("d=", d));
      absl::StatusOr<PipelineRoute> route =
          PlanPipelineRoute(split, P, c.decode_tp, d, c.prefill, c.decode);
      ASSERT_TRUE(route.ok()) << route.status();
      std::vector<PipelineSource> expected;
      DecodeTargets targets;
      for (int stage = 0; stage < 2; ++stage) {
        for (const SourceFragments& source : plain_routes[d].sources) {
          PipelineSource mine{stage, source.prefill_rank, stage * P + source.prefill_rank, {}};
          for (const Fragment& f : source.fragments) {
            if (StageOf(split, f.field_id) == stage) {
              mine.fragments.push_back(f);
            }
          }
          if (mine.fragments.empty()) {
            continue;
          }
          targets.expected_prefill_ranks.push_back(mine.prefill_rank);
          expected.push_back(std::move(mine));
        }
        for (int p = 0; p < P && d == 0; ++p) {
          if (stage_served[stage][p].empty()) {
            targets.dummy_tp_ranks.push_back(stage * P + p);
          }
        }
      }
      std::set<int> all(targets.expected_prefill_ranks.begin(),
                        targets.expected_prefill_ranks.end());
      all.insert(targets.dummy_tp_ranks.begin(), targets.dummy_tp_ranks.end());
      targets.target_tp_ranks.assign(all.begin(), all.end());

      EXPECT_FALSE(route->whole_field_copy);
      ASSERT_EQ(route->sources.size(), expected.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(route->sources[i].stage, expected[i].stage);
        EXPECT_EQ(route->sources[i].stage_tp_rank, expected[i].stage_tp_rank);
        EXPECT_EQ(route->sources[i].prefill_rank, expected[i].prefill_rank);
        EXPECT_EQ(route->sources[i].fragments, expected[i].fragments);
      }
      EXPECT_EQ(route->targets, targets);
    }
  }
  EXPECT_GT(split_cases, 10);
}

// The prefill side (one stage planner per rank) and the decode side (PlanPipelineRoute) agree:
// a rank sends to d exactly when d's route lists it, with the same fragments; it is a dummy
// exactly when d == 0 lists it as one; it rejects everything else; and it expects one
// pre-allocation from each decode rank whose route lists it.
TEST(PipelineTest, StagePrefillRanksAgreeWithDecodeRoutes) {
  for (const nlohmann::json& entry : PlannerCases()) {
    if (!entry.at("result").at("ok").get<bool>()) {
      continue;
    }
    const PlannerCase c = ReadPlannerCase(entry);
    if (c.prefill.plan.fields.size() < 2) {
      continue;
    }
    SCOPED_TRACE(c.name);
    const int P = c.prefill_tp;
    for (const PipelineLayout& layout :
         {PipelineLayout::SingleStage(c.prefill), SplitLayers(c.prefill)}) {
      std::vector<PipelineRoute> routes;
      for (int d = 0; d < c.decode_tp; ++d) {
        absl::StatusOr<PipelineRoute> route =
            PlanPipelineRoute(layout, P, c.decode_tp, d, c.prefill, c.decode);
        ASSERT_TRUE(route.ok()) << route.status();
        routes.push_back(*std::move(route));
      }
      for (int stage = 0; stage < layout.pp_size; ++stage) {
        absl::StatusOr<Planner> planner =
            CreateStagePlanner(layout, stage, P, c.decode_tp, c.prefill, c.decode);
        ASSERT_TRUE(planner.ok()) << planner.status();
        for (int p = 0; p < P; ++p) {
          const int global = GlobalPrefillRank(stage, P, p);
          std::vector<int> listed_by;
          for (int d = 0; d < c.decode_tp; ++d) {
            SCOPED_TRACE(absl::StrCat("stage=", stage, " p=", p, " d=", d));
            const RegistrationOutcome outcome = planner->OnRegistration(p, d);
            const PipelineRoute& route = routes[d];
            auto source = std::find_if(
                route.sources.begin(), route.sources.end(),
                [global](const PipelineSource& s) { return s.prefill_rank == global; });
            const auto& dummies = route.targets.dummy_tp_ranks;
            if (source != route.sources.end()) {
              listed_by.push_back(d);
              EXPECT_EQ(outcome.kind, RegistrationOutcome::Kind::kSend) << outcome.error;
              EXPECT_EQ(outcome.fragments, source->fragments);
            } else if (std::find(dummies.begin(), dummies.end(), global) != dummies.end()) {
              EXPECT_EQ(outcome.kind, RegistrationOutcome::Kind::kDummy) << outcome.error;
            } else {
              EXPECT_EQ(outcome.kind, RegistrationOutcome::Kind::kReject);
            }
          }
          EXPECT_EQ(planner->DecodeRanksServedBy(p), listed_by);
          EXPECT_EQ(planner->RequiredPreallocations(p),
                    listed_by.empty() ? 1 : static_cast<int>(listed_by.size()));
        }
      }
    }
  }
}

const PlannerCase& Mha() {
  static const PlannerCase* c = [] {
    for (const nlohmann::json& entry : PlannerCases()) {
      if (entry.at("name") == "mha_kv8_p2_d1") {
        return new PlannerCase(ReadPlannerCase(entry));
      }
    }
    return new PlannerCase();
  }();
  return *c;
}

TEST(PipelineTest, LayoutMustPlaceEveryFieldInExactlyOneStage) {
  const layout::Contract& wire = Mha().prefill;
  const std::vector<std::pair<PipelineLayout, std::string>> bad = {
      {{2, {{"layer.0.k", "layer.0.v"}, {"layer.1.k"}}}, "'layer.1.v' is held by no"},
      {{2, {{"layer.0.k", "layer.0.v", "layer.1.k"}, {"layer.1.k", "layer.1.v"}}},
       "held by prefill stages 0 and 1"},
      {{2, {{"layer.0.k", "layer.0.v", "layer.0.v"}, {"layer.1.k", "layer.1.v"}}},
       "held by prefill stages 0 and 0"},
      {{2, {{"layer.0.k", "layer.0.v", "layer.9.k"}, {"layer.1.k", "layer.1.v"}}},
       "'layer.9.k', which the wire contract does not declare: cache stage placement must cover "
       "every logical field exactly once"},
      {{3, {{"layer.0.k", "layer.0.v"}, {"layer.1.k", "layer.1.v"}}}, "has 2 stages"},
      {{0, {}}, "pp_size 0"},
  };
  for (const auto& [layout, problem] : bad) {
    SCOPED_TRACE(problem);
    const absl::Status status = ValidatePipelineLayout(layout, wire);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(CategoryOf(status), ErrorCategory::kUnsupportedLayout);
    EXPECT_TRUE(Mentions(status, problem)) << status;
    EXPECT_TRUE(Mentions(status, "CACHEPD §12")) << status;
    EXPECT_FALSE(PlanPipelineRoute(layout, 2, 1, 0, wire, Mha().decode).ok());
    EXPECT_FALSE(CreateStagePlanner(layout, 0, 2, 1, wire, Mha().decode).ok());
  }
}

TEST(PipelineTest, StageOutOfRangeIsRefused) {
  const PipelineLayout single = PipelineLayout::SingleStage(Mha().prefill);
  absl::StatusOr<Planner> planner =
      CreateStagePlanner(single, 1, 2, 1, Mha().prefill, Mha().decode);
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
}

TEST(PipelineTest, StageWithoutFieldsHasNoRoute) {
  const layout::Contract& wire = Mha().prefill;
  PipelineLayout layout{2, {testing::FieldIds(wire), {}}};
  ASSERT_TRUE(ValidatePipelineLayout(layout, wire).ok());
  absl::StatusOr<PipelineRoute> route = PlanPipelineRoute(layout, 2, 1, 0, wire, Mha().decode);
  ASSERT_FALSE(route.ok());
  EXPECT_EQ(CategoryOf(route.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(route.status(), "prefill stage 1")) << route.status();
  EXPECT_TRUE(Mentions(route.status(), "has no source fragments")) << route.status();
}

TEST(PipelineTest, StageTpSizeDividesTheWorldByDpAndPp) {
  EXPECT_EQ(*StageTpSize(16, 2, 2), 4);
  EXPECT_EQ(*StageTpSize(8, 1, 1), 8);
  EXPECT_EQ(*StageTpSize(4096, 2, 2), 1024);
  for (auto [tp, dp, pp] : std::vector<std::tuple<int, int, int>>{
           {16, 3, 1}, {0, 1, 1}, {8, 0, 1}, {8, 1, 0}, {8, 1, -2}, {2048, 1, 1}, {4, 2, 4}}) {
    absl::StatusOr<int> size = StageTpSize(tp, dp, pp);
    EXPECT_FALSE(size.ok()) << tp << " " << dp << " " << pp;
    EXPECT_EQ(CategoryOf(size.status()), ErrorCategory::kUnsupportedLayout);
  }
}

TEST(PipelineTest, GlobalRankIdsAreStageMajor) {
  EXPECT_EQ(GlobalPrefillRank(0, 4, 3), 3);
  EXPECT_EQ(GlobalPrefillRank(2, 4, 1), 9);
}

// The reference's build_pipeline_transfer_plan (CACHEPD §12.6) on every case of
// r2/pipeline_r2.json and every decode rank: the same stage-major sources, fragments, owner
// filters, dummies and T_d, or an error of the same category carrying the reference's words.
TEST(PipelineTest, EveryR2CaseAndDecodeRankMatchesTheReference) {
  const nlohmann::json vectors = kvrail::testing::LoadVectors("r2/pipeline_r2.json");
  int routes = 0;
  for (const nlohmann::json& entry : vectors.at("cases")) {
    const std::string name = entry.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const int stage_tp = entry.at("prefill_stage_tp_size").get<int>();
    const int decode_tp = entry.at("decode_tp_size").get<int>();
    const layout::Contract prefill = testing::ReadR2Contract(name, entry.at("prefill_contract"));
    const layout::Contract decode = testing::ReadR2Contract(name, entry.at("decode_contract"));
    PipelineLayout placement;
    placement.fields_by_stage =
        entry.at("cache_fields_by_stage").get<std::vector<std::vector<std::string>>>();
    placement.pp_size = static_cast<int>(placement.fields_by_stage.size());
    ASSERT_EQ(entry.at("routes").size(), static_cast<size_t>(decode_tp));
    for (const nlohmann::json& want : entry.at("routes")) {
      const int d = want.at("decode_tp_rank").get<int>();
      SCOPED_TRACE(absl::StrCat("d=", d));
      absl::StatusOr<PipelineRoute> route =
          PlanPipelineRoute(placement, stage_tp, decode_tp, d, prefill, decode);
      if (!want.at("ok").get<bool>()) {
        ASSERT_FALSE(route.ok());
        EXPECT_EQ(CategoryOf(route.status()), testing::CategoryOfReferenceError(want["error"]));
        const std::string message = want["error"]["message"].get<std::string>();
        absl::string_view words = message;
        absl::ConsumePrefix(&words, "Cache-transfer ");
        EXPECT_TRUE(Mentions(route.status(), words)) << route.status() << " vs " << words;
        continue;
      }
      ASSERT_TRUE(route.ok()) << route.status();
      const nlohmann::json& by_rank = want.at("fragments_by_prefill_rank");
      std::vector<int> sources;
      for (const PipelineSource& source : route->sources) {
        sources.push_back(source.prefill_rank);
        EXPECT_EQ(source.prefill_rank,
                  GlobalPrefillRank(source.stage, stage_tp, source.stage_tp_rank));
        const std::string key = std::to_string(source.prefill_rank);
        ASSERT_TRUE(by_rank.contains(key)) << key;
        EXPECT_EQ(source.fragments, testing::FragmentsFromJson(by_rank.at(key))) << key;
        EXPECT_EQ(source.owner_filters,
                  testing::OwnerFiltersFromJson(want.at("owner_filters_by_prefill_rank").at(key)))
            << key;
      }
      EXPECT_EQ(sources, testing::IntsFromJson(want.at("target_prefill_ranks")));
      EXPECT_EQ(route->whole_field_copy,
                by_rank.size() == 1 && by_rank.begin()->empty() && stage_tp == decode_tp);
      EXPECT_EQ(route->targets.expected_prefill_ranks,
                testing::IntsFromJson(want.at("target_prefill_ranks")));
      EXPECT_EQ(route->targets.dummy_tp_ranks, testing::IntsFromJson(want.at("dummy_ranks")));
      EXPECT_EQ(route->targets.target_tp_ranks, testing::IntsFromJson(want.at("targets_T_d")));
      ++routes;
    }
  }
  EXPECT_GE(routes, 6);
}

}  // namespace
}  // namespace kvrail::plan
