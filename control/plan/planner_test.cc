#include "control/plan/planner.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/layout/contract.h"
#include "control/layout/dtype.h"
#include "control/plan/vector_cases.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

using testing::CategoryOfReferenceError;
using testing::FragmentsFromJson;
using testing::IntsFromJson;
using testing::PlannerCase;
using testing::PlannerCases;
using testing::ReadPlannerCase;

bool Mentions(const absl::Status& status, absl::string_view text) {
  return status.message().find(text) != absl::string_view::npos;
}

// Every member of planner.json's `result`, for every case: constructor errors, S_p, each decode
// rank's route and targets (or error), every (p, d) registration, and the required counts.
TEST(PlannerVectorsTest, EveryCaseMatchesTheReference) {
  int ok_cases = 0, error_cases = 0;
  for (const nlohmann::json& entry : PlannerCases()) {
    const PlannerCase c = ReadPlannerCase(entry);
    SCOPED_TRACE(c.name);
    const nlohmann::json& result = *c.result;
    absl::StatusOr<Planner> planner =
        Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode);
    if (!result.at("ok").get<bool>()) {
      ASSERT_FALSE(planner.ok());
      EXPECT_EQ(result.at("stage"), "planner_constructor");
      EXPECT_EQ(CategoryOf(planner.status()), CategoryOfReferenceError(result.at("error")))
          << planner.status();
      ++error_cases;
      continue;
    }
    ASSERT_TRUE(planner.ok()) << planner.status();
    ++ok_cases;

    const nlohmann::json& served = result.at("decode_ranks_by_prefill_rank");
    ASSERT_EQ(served.size(), static_cast<size_t>(c.prefill_tp));
    for (const nlohmann::json& s : served) {
      const int p = s.at("prefill_tp_rank").get<int>();
      EXPECT_EQ(planner->DecodeRanksServedBy(p), IntsFromJson(s.at("decode_tp_ranks")))
          << "p=" << p;
    }

    const nlohmann::json& decode_ranks = result.at("decode_ranks");
    ASSERT_EQ(decode_ranks.size(), static_cast<size_t>(c.decode_tp));
    for (const nlohmann::json& dr : decode_ranks) {
      const int d = dr.at("decode_tp_rank").get<int>();
      SCOPED_TRACE(absl::StrCat("d=", d));
      absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
      absl::StatusOr<DecodeTargets> targets = planner->TargetsFor(d);
      if (dr.contains("error")) {
        const auto category = CategoryOfReferenceError(dr.at("error"));
        ASSERT_FALSE(route.ok());
        EXPECT_EQ(CategoryOf(route.status()), category);
        ASSERT_FALSE(targets.ok());
        EXPECT_EQ(CategoryOf(targets.status()), category);
        continue;
      }
      ASSERT_TRUE(route.ok()) << route.status();
      ASSERT_TRUE(targets.ok()) << targets.status();
      EXPECT_EQ(route->whole_field_copy, dr.at("whole_field_copy").get<bool>());
      const nlohmann::json& by_rank = dr.at("fragments_by_prefill_rank");
      ASSERT_EQ(route->sources.size(), by_rank.size());
      for (size_t i = 0; i < by_rank.size(); ++i) {
        EXPECT_EQ(route->sources[i].prefill_rank, by_rank[i].at("prefill_tp_rank").get<int>());
        EXPECT_EQ(route->sources[i].fragments, FragmentsFromJson(by_rank[i].at("fragments")))
            << "source " << route->sources[i].prefill_rank;
      }
      EXPECT_EQ(targets->expected_prefill_ranks, IntsFromJson(dr.at("expected_prefill_ranks")));
      EXPECT_EQ(targets->dummy_tp_ranks, IntsFromJson(dr.at("dummy_tp_ranks")));
      EXPECT_EQ(targets->target_tp_ranks, IntsFromJson(dr.at("target_tp_ranks")));
    }

    const nlohmann::json& registrations = result.at("prefill_registrations");
    ASSERT_EQ(registrations.size(), static_cast<size_t>(c.prefill_tp * c.decode_tp));
    for (const nlohmann::json& reg : registrations) {
      const int p = reg.at("prefill_tp_rank").get<int>();
      const int d = reg.at("decode_tp_rank").get<int>();
      SCOPED_TRACE(absl::StrCat("registration p=", p, " d=", d));
      const RegistrationOutcome outcome = planner->OnRegistration(p, d);
      EXPECT_EQ(OutcomeName(outcome.kind), reg.at("outcome").get<std::string>());
      if (reg.at("outcome") == "reject") {
        EXPECT_FALSE(outcome.error.ok());
        EXPECT_EQ(CategoryOf(outcome.error), CategoryOfReferenceError(reg.at("error")))
            << outcome.error;
        EXPECT_TRUE(outcome.fragments.empty());
        EXPECT_TRUE(outcome.expected_decode_ranks.empty());
      } else {
        EXPECT_TRUE(outcome.error.ok()) << outcome.error;
        EXPECT_EQ(outcome.fragments, FragmentsFromJson(reg.at("fragments")));
        EXPECT_EQ(outcome.expected_decode_ranks, IntsFromJson(reg.at("expected_decode_ranks")));
      }
    }

    const nlohmann::json& counts = result.at("required_counts");
    std::vector<int> preallocations, completions;
    for (int p = 0; p < c.prefill_tp; ++p) {
      preallocations.push_back(planner->RequiredPreallocations(p));
    }
    for (int d = 0; d < c.decode_tp; ++d) {
      completions.push_back(planner->RequiredCompletions(d));
    }
    EXPECT_EQ(preallocations, IntsFromJson(counts.at("preallocations_per_room_by_prefill_rank")));
    EXPECT_EQ(completions, IntsFromJson(counts.at("completions_per_room_by_decode_rank")));
  }
  EXPECT_GT(ok_cases, 0);
  EXPECT_GT(error_cases, 0);
}

// descriptors.json: the registration outcome and fragments of the (prefill rank, decode rank)
// each case resolves. The address triples belong to the resolver.
TEST(PlannerVectorsTest, DescriptorCasesRegisterWithTheReferenceFragments) {
  int cases = 0;
  for (const nlohmann::json& entry : testing::DescriptorCases()) {
    SCOPED_TRACE(entry.at("name").get<std::string>());
    absl::StatusOr<layout::Contract> prefill =
        layout::ParseContract(entry.at("prefill_contract").get<std::string>());
    absl::StatusOr<layout::Contract> decode =
        layout::ParseContract(entry.at("decode_contract").get<std::string>());
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    ASSERT_TRUE(decode.ok()) << decode.status();
    absl::StatusOr<Planner> planner =
        Planner::Create(entry.at("prefill_tp_size").get<int>(),
                        entry.at("decode_tp_size").get<int>(), *prefill, *decode);
    ASSERT_TRUE(planner.ok()) << planner.status();
    const RegistrationOutcome outcome = planner->OnRegistration(
        entry.at("prefill_tp_rank").get<int>(), entry.at("decode_tp_rank").get<int>());
    EXPECT_EQ(OutcomeName(outcome.kind), entry.at("registration_outcome").get<std::string>());
    EXPECT_EQ(outcome.fragments, FragmentsFromJson(entry.at("fragments")));
    ++cases;
  }
  EXPECT_EQ(cases, 12);
}

const nlohmann::json& CaseNamed(absl::string_view name) {
  for (const nlohmann::json& entry : PlannerCases()) {
    if (entry.at("name") == static_cast<std::string>(name)) {
      return entry;
    }
  }
  ADD_FAILURE() << "no planner case " << name;
  return PlannerCases()[0];
}

// CACHEPD §6.4: layer.0.k split on axis 1 (G = 4) from P = 1 to D = 2, and a replicated
// latent from prefill rank floor(1 * 1 / 2) = 0.
TEST(PlannerTest, WorkedExampleOfSection64) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("test_tokenmajor_p1_d2"));
  absl::StatusOr<Planner> planner = Planner::Create(1, 2, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  absl::StatusOr<Route> route = planner->PlanForDecodeRank(1);
  ASSERT_TRUE(route.ok()) << route.status();
  ASSERT_EQ(route->sources.size(), 1u);
  EXPECT_EQ(route->sources[0].prefill_rank, 0);
  EXPECT_EQ(route->sources[0].fragments,
            (std::vector<Fragment>{{"history", "layer.0.k", 8, 0, 16, 8, 8, 2},
                                   {"history", "layer.1.latent", 0, 0, 4, 4, 4, 1}}));
}

// §6.4 test_qkv_parts: global parts [4, 4, 8] on axis 0 give decode rank 1 one fragment per
// part.
TEST(PlannerTest, GlobalPartsGiveOneFragmentPerPart) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("test_qkv_parts_p1_d2"));
  absl::StatusOr<Planner> planner = Planner::Create(1, 2, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  absl::StatusOr<Route> route = planner->PlanForDecodeRank(1);
  ASSERT_TRUE(route.ok()) << route.status();
  std::vector<int64_t> src, dst, length;
  for (const Fragment& f : route->Find(0)->fragments) {
    EXPECT_EQ(f.field_id, "layer.0.conv");
    src.push_back(f.src_byte_offset);
    dst.push_back(f.dst_byte_offset);
    length.push_back(f.bytes_per_row);
  }
  EXPECT_EQ(src, (std::vector<int64_t>{8, 24, 48}));
  EXPECT_EQ(dst, (std::vector<int64_t>{0, 8, 16}));
  EXPECT_EQ(length, (std::vector<int64_t>{8, 8, 16}));
}

TEST(PlannerTest, EqualTpCopiesEveryFieldWholeFromTheSameRank) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("dsa_p8_d8"));
  absl::StatusOr<Planner> planner = Planner::Create(8, 8, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_TRUE(planner->whole_field_copy());
  for (int d = 0; d < 8; ++d) {
    absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
    ASSERT_TRUE(route.ok()) << route.status();
    EXPECT_TRUE(route->whole_field_copy);
    ASSERT_EQ(route->PrefillRanks(), std::vector<int>{d});
    EXPECT_TRUE(route->sources[0].fragments.empty());
    EXPECT_EQ(planner->DecodeRanksServedBy(d), std::vector<int>{d});
  }
}

TEST(PlannerTest, TpSizesOutsideOneTo1024AreUnsupported) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("mha_kv8_p1_d2"));
  for (auto [p, d] : std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {1025, 1}, {1, 1025}}) {
    absl::StatusOr<Planner> planner = Planner::Create(p, d, c.prefill, c.decode);
    ASSERT_FALSE(planner.ok());
    EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
    EXPECT_TRUE(Mentions(planner.status(), "1..1024")) << planner.status();
    EXPECT_TRUE(Mentions(planner.status(), "CACHEPD §6.1")) << planner.status();
  }
}

TEST(PlannerTest, PeerCheckFailureKeepsItsCategory) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("err_dtype"));
  absl::StatusOr<Planner> planner = Planner::Create(1, 2, c.prefill, c.decode);
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kIncompatiblePeer);
}

TEST(PlannerTest, UnmappableShardCountNamesFieldAndTp) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("err_tp_not_multiple_of_shards"));
  absl::StatusOr<Planner> planner = Planner::Create(2, 3, c.prefill, c.decode);
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(planner.status(), "'layer.0.k'")) << planner.status();
  EXPECT_TRUE(Mentions(planner.status(), "TP=3")) << planner.status();
  EXPECT_TRUE(Mentions(planner.status(), "CACHEPD §6.2")) << planner.status();
}

TEST(PlannerTest, EqualTpGeometryMismatchNamesTheField) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("err_equal_tp_local_geometry"));
  absl::StatusOr<Planner> planner = Planner::Create(2, 2, c.prefill, c.decode);
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(planner.status(), "'layer.0.k'")) << planner.status();
  EXPECT_TRUE(Mentions(planner.status(), "CACHEPD §6.1")) << planner.status();
}

TEST(PlannerTest, ContractWithoutFieldsHasNoRoute) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("err_no_fields_heterogeneous"));
  absl::StatusOr<Planner> planner = Planner::Create(1, 2, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  absl::StatusOr<Route> route = planner->PlanForDecodeRank(0);
  ASSERT_FALSE(route.ok());
  EXPECT_EQ(CategoryOf(route.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(route.status(), "has no source fragments")) << route.status();
  EXPECT_EQ(planner->RequiredPreallocations(0), 1);
  EXPECT_EQ(planner->RequiredCompletions(0), 0);
  EXPECT_EQ(planner->OnRegistration(0, 0).kind, RegistrationOutcome::Kind::kReject);
}

TEST(PlannerTest, RanksOutOfRangeAreRefused) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("mha_kv8_p1_d2"));
  absl::StatusOr<Planner> planner = Planner::Create(1, 2, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  for (int d : {-1, 2}) {
    absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
    ASSERT_FALSE(route.ok());
    EXPECT_EQ(CategoryOf(route.status()), ErrorCategory::kUnsupportedLayout);
    EXPECT_FALSE(planner->TargetsFor(d).ok());
    EXPECT_EQ(planner->OnRegistration(0, d).kind, RegistrationOutcome::Kind::kReject);
    EXPECT_EQ(planner->RequiredCompletions(d), 0);
  }
  for (int p : {-1, 1}) {
    const RegistrationOutcome outcome = planner->OnRegistration(p, 0);
    EXPECT_EQ(outcome.kind, RegistrationOutcome::Kind::kReject);
    EXPECT_EQ(CategoryOf(outcome.error), ErrorCategory::kUnsupportedLayout);
    EXPECT_TRUE(planner->DecodeRanksServedBy(p).empty());
    EXPECT_EQ(planner->RequiredPreallocations(p), 0);
  }
}

TEST(PlannerTest, WrongRankRegistrationIsRejectedWithTheRule) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("gqa_kv4_p8_d2"));
  absl::StatusOr<Planner> planner = Planner::Create(8, 2, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  const RegistrationOutcome outcome = planner->OnRegistration(4, 0);
  EXPECT_EQ(outcome.kind, RegistrationOutcome::Kind::kReject);
  EXPECT_TRUE(Mentions(outcome.error, "wrong prefill TP rank 4")) << outcome.error;
  EXPECT_TRUE(Mentions(outcome.error, "CACHEPD §3.2.2")) << outcome.error;
  // Odd ranks duplicate their neighbours: dummies for decode rank 0 only (§6.5).
  EXPECT_EQ(planner->OnRegistration(1, 0).kind, RegistrationOutcome::Kind::kDummy);
  EXPECT_EQ(planner->OnRegistration(1, 0).expected_decode_ranks, std::vector<int>{0});
  EXPECT_EQ(planner->OnRegistration(1, 1).kind, RegistrationOutcome::Kind::kReject);
}

TEST(PlannerTest, StageFilterMustNameContractFields) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("mha_kv8_p1_d2"));
  StageFilter filter{{"layer.0.k", "layer.99.k"}};
  absl::StatusOr<Planner> planner = Planner::Create(1, 2, c.prefill, c.decode, &filter);
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(planner.status(), "'layer.99.k'")) << planner.status();
  EXPECT_TRUE(Mentions(planner.status(), "stage placement contains unknown cache fields"))
      << planner.status();
}

TEST(PlannerTest, StageFilterHoldingEveryFieldIsThePlainPlanner) {
  const PlannerCase c = ReadPlannerCase(CaseNamed("dsa_p8_d8"));
  StageFilter all{testing::FieldIds(c.prefill)};
  absl::StatusOr<Planner> planner = Planner::Create(8, 8, c.prefill, c.decode, &all);
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_TRUE(planner->whole_field_copy());
}

// ---- A brute-force §6.3 over synthetic partitions, checking the planner's shard-range walk.

layout::Contract OneFieldContract(int64_t rows, int64_t local, int64_t inner, int64_t global,
                                  std::vector<int64_t> parts) {
  layout::Contract contract;
  contract.plan.prefix_granularity = 1;
  const int64_t payload = rows * local * inner * 2 + 8;
  contract.plan.lcm_block_bytes = payload;
  contract.plan.num_lcm_blocks = 1;
  contract.plan.groups.push_back({"g", 1, 2});
  contract.plan.planes.push_back({"plane.k", rows * local * inner * 2, 0});
  contract.plan.planes.push_back({"plane.r", 8, 2 * rows * local * inner * 2});
  layout::FieldLayout k;
  k.group_id = "g";
  k.field_id = "layer.0.k";
  k.plane_id = "plane.k";
  k.shape = {rows, local, inner};
  k.dtype = layout::DType::kBfloat16;
  k.page_stride_bytes = rows * local * inner * 2;
  contract.plan.fields.push_back(k);
  layout::FieldLayout r;
  r.group_id = "g";
  r.field_id = "layer.0.r";
  r.plane_id = "plane.r";
  r.shape = {4};
  r.dtype = layout::DType::kBfloat16;
  r.page_stride_bytes = 8;
  contract.plan.fields.push_back(r);
  layout::GroupSpec spec;
  spec.group_id = "g";
  spec.rows_per_page = 1;
  spec.entry_stride_tokens = 1;
  contract.group_specs.push_back(spec);
  contract.transfer_schema.push_back({"layer.0.k", {1, global, std::move(parts)}});
  return contract;
}

// §6.3 as the reference writes it: every representative prefill rank, every part.
std::map<int, std::vector<Fragment>> BruteForce(const layout::Contract& prefill,
                                                const layout::Contract& decode, int P, int D,
                                                int d) {
  std::map<int, std::vector<Fragment>> out;
  const layout::FieldLayout& pk = prefill.plan.fields[0];
  const layout::FieldLayout& dk = decode.plan.fields[0];
  const layout::Partition& partition = prefill.transfer_schema[0].partition;
  ShardMap src = *ShardMap::Create("k", partition, pk.shape[1], P);
  ShardMap dst = *ShardMap::Create("k", partition, dk.shape[1], D);
  const int64_t inner = pk.shape[2] * 2;
  const std::vector<RankInterval> di = dst.Intervals(d);
  for (int p = 0; p < P; ++p) {
    if (!src.IsRepresentative(p)) {
      continue;
    }
    const std::vector<RankInterval> pi = src.Intervals(p);
    for (size_t i = 0; i < pi.size(); ++i) {
      const int64_t a = std::max(pi[i].global_begin, di[i].global_begin);
      const int64_t b = std::min(pi[i].global_end, di[i].global_end);
      if (a >= b) {
        continue;
      }
      Fragment f{"g",
                 "layer.0.k",
                 (pi[i].local_offset + a - pi[i].global_begin) * inner,
                 (di[i].local_offset + a - di[i].global_begin) * inner,
                 pk.shape[1] * inner,
                 dk.shape[1] * inner,
                 (b - a) * inner,
                 pk.shape[0]};
      if (f.rows_per_page > 1 && f.src_row_stride_bytes == f.bytes_per_row &&
          f.dst_row_stride_bytes == f.bytes_per_row) {
        f.bytes_per_row *= f.rows_per_page;
        f.src_row_stride_bytes = f.dst_row_stride_bytes = f.bytes_per_row;
        f.rows_per_page = 1;
      }
      out[p].push_back(f);
    }
  }
  out[static_cast<int>(int64_t{d} * P / D)].push_back(Fragment{"g", "layer.0.r", 0, 0, 8, 8, 8, 1});
  return out;
}

TEST(PlannerTest, MatchesBruteForceOverSyntheticPartitions) {
  int checked = 0;
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> partitions = {
      {4, {}}, {6, {}}, {8, {}}, {12, {}}, {12, {6, 6}}, {24, {12, 6, 6}}, {16, {4, 4, 8}}};
  for (const auto& [global, parts] : partitions) {
    for (int P = 1; P <= 8; ++P) {
      for (int D = 1; D <= 8; ++D) {
        if (P == D) {
          continue;
        }
        for (int64_t kp = 1; kp <= global; ++kp) {
          for (int64_t kd = 1; kd <= global; ++kd) {
            if (global % kp || global % kd || P % kp || D % kd || kp > P || kd > D) {
              continue;
            }
            bool parts_ok = true;
            for (int64_t part : parts) {
              parts_ok &= part % kp == 0 && part % kd == 0;
            }
            if (!parts_ok) {
              continue;
            }
            for (int64_t rows : {1, 2}) {
              const layout::Contract prefill =
                  OneFieldContract(rows, global / kp, 2, global, parts);
              const layout::Contract decode = OneFieldContract(rows, global / kd, 2, global, parts);
              ASSERT_TRUE(layout::ValidateContract(prefill).ok());
              absl::StatusOr<Planner> planner = Planner::Create(P, D, prefill, decode);
              ASSERT_TRUE(planner.ok()) << planner.status();
              std::map<int, std::vector<int>> served;
              for (int d = 0; d < D; ++d) {
                SCOPED_TRACE(absl::StrCat("G=", global, " P=", P, " D=", D, " kp=", kp, " kd=", kd,
                                          " rows=", rows, " d=", d));
                const auto expected = BruteForce(prefill, decode, P, D, d);
                absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
                ASSERT_TRUE(route.ok()) << route.status();
                ASSERT_EQ(route->sources.size(), expected.size());
                size_t i = 0;
                for (const auto& [p, fragments] : expected) {
                  EXPECT_EQ(route->sources[i].prefill_rank, p);
                  EXPECT_EQ(route->sources[i].fragments, fragments);
                  served[p].push_back(d);
                  ++i;
                }
                ++checked;
              }
              for (int p = 0; p < P; ++p) {
                EXPECT_EQ(planner->DecodeRanksServedBy(p), served[p]);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

// Every route of every vector case writes each byte of each decode page exactly once and reads
// only inside the prefill page.
TEST(PlannerTest, EveryDecodeByteIsWrittenExactlyOnce) {
  for (const nlohmann::json& entry : PlannerCases()) {
    if (!entry.at("result").at("ok").get<bool>()) {
      continue;
    }
    const PlannerCase c = ReadPlannerCase(entry);
    SCOPED_TRACE(c.name);
    absl::StatusOr<Planner> planner =
        Planner::Create(c.prefill_tp, c.decode_tp, c.prefill, c.decode);
    ASSERT_TRUE(planner.ok()) << planner.status();
    if (planner->whole_field_copy()) {
      continue;
    }
    for (int d = 0; d < c.decode_tp; ++d) {
      absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
      if (!route.ok()) {
        continue;
      }
      std::map<std::string, std::vector<int>> written;
      for (const layout::FieldLayout& field : c.decode.plan.fields) {
        written[field.field_id].assign(layout::PayloadBytes(field), 0);
      }
      for (const SourceFragments& source : route->sources) {
        for (const Fragment& f : source.fragments) {
          const int64_t src_payload = layout::PayloadBytes(*c.prefill.FindField(f.field_id));
          std::vector<int>& bytes = written[f.field_id];
          for (int64_t row = 0; row < f.rows_per_page; ++row) {
            const int64_t src = f.src_byte_offset + row * f.src_row_stride_bytes;
            const int64_t dst = f.dst_byte_offset + row * f.dst_row_stride_bytes;
            ASSERT_LE(src + f.bytes_per_row, src_payload) << f;
            ASSERT_LE(dst + f.bytes_per_row, static_cast<int64_t>(bytes.size())) << f;
            for (int64_t i = 0; i < f.bytes_per_row; ++i) {
              ++bytes[dst + i];
            }
          }
        }
      }
      for (const auto& [field_id, bytes] : written) {
        for (size_t i = 0; i < bytes.size(); ++i) {
          ASSERT_EQ(bytes[i], 1) << field_id << " byte " << i << " d=" << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvrail::plan
