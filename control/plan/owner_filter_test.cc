// Page-sharded (DCP) prefill groups and their owner filters (CACHEPD §12.7, §12.8), against
// r2/dcp_r2.json and byte by byte.
#include "control/plan/owner_filter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/plan/route.h"
#include "control/plan/vector_cases.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

bool Mentions(const absl::Status& status, absl::string_view text) {
  return status.message().find(text) != absl::string_view::npos;
}

const nlohmann::json& Dcp() {
  static const nlohmann::json* vectors =
      new nlohmann::json(kvrail::testing::LoadVectors("r2/dcp_r2.json"));
  return *vectors;
}

struct Case {
  std::string name;
  layout::Contract prefill;
  layout::Contract decode;
  int p = 1;
  int d = 1;
};

Case DcpPlannerCase(const std::string& name) {
  for (const nlohmann::json& c : Dcp().at("planner")) {
    if (c.at("name") == name) {
      return {name, testing::ReadR2Contract(name, c.at("prefill_contract")),
              testing::ReadR2Contract(name, c.at("decode_contract")),
              c.at("prefill_tp_size").get<int>(), c.at("decode_tp_size").get<int>()};
    }
  }
  ADD_FAILURE() << "no dcp planner case " << name;
  return {};
}

Case SnapshotPlannerCase(const std::string& name) {
  for (const nlohmann::json& entry : testing::PlannerCases()) {
    if (entry.at("name") == name) {
      testing::PlannerCase c = testing::ReadPlannerCase(entry);
      return {name, c.prefill, c.decode, c.prefill_tp, c.decode_tp};
    }
  }
  ADD_FAILURE() << "no planner case " << name;
  return {};
}

std::vector<GroupOwnerFilter> SortedByGroup(std::vector<GroupOwnerFilter> decisions) {
  std::sort(
      decisions.begin(), decisions.end(),
      [](const GroupOwnerFilter& a, const GroupOwnerFilter& b) { return a.group_id < b.group_id; });
  return decisions;
}

// The reference's CacheTransferPlanner with shard_count (dcp_r2.json `planner`): the same
// refusals, sharded group ids, S_p, sources, fragments and owner filters, for every decode rank.
TEST(OwnerFilterTest, DcpPlannerCasesMatchTheReference) {
  int plans = 0;
  for (const nlohmann::json& entry : Dcp().at("planner")) {
    const Case c = DcpPlannerCase(entry.at("name").get<std::string>());
    SCOPED_TRACE(c.name);
    const nlohmann::json& want = entry.at("result");
    absl::StatusOr<Planner> planner = Planner::Create(c.p, c.d, c.prefill, c.decode);
    if (!want.at("ok").get<bool>()) {
      ASSERT_FALSE(planner.ok());
      EXPECT_EQ(CategoryOf(planner.status()), testing::CategoryOfReferenceError(want["error"]));
      EXPECT_TRUE(Mentions(planner.status(), want["error"]["message"].get<std::string>()))
          << planner.status();
      continue;
    }
    ASSERT_TRUE(planner.ok()) << planner.status();
    EXPECT_EQ(planner->sharded_group_ids(),
              want.at("sharded_group_ids").get<std::vector<std::string>>());
    EXPECT_FALSE(planner->whole_field_copy());  // a sharded group leaves the whole-field copy
    for (int p = 0; p < c.p; ++p) {
      EXPECT_EQ(
          planner->DecodeRanksServedBy(p),
          testing::IntsFromJson(want.at("decode_ranks_by_prefill_rank").at(std::to_string(p))))
          << "p=" << p;
    }
    for (const nlohmann::json& plan : want.at("plans")) {
      const int d = plan.at("decode_tp_rank").get<int>();
      SCOPED_TRACE(absl::StrCat("d=", d));
      absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
      ASSERT_TRUE(route.ok()) << route.status();
      EXPECT_EQ(route->PrefillRanks(), testing::IntsFromJson(plan.at("target_prefill_ranks")));
      for (const SourceFragments& source : route->sources) {
        const std::string key = std::to_string(source.prefill_rank);
        EXPECT_EQ(source.fragments,
                  testing::FragmentsFromJson(plan.at("fragments_by_prefill_rank").at(key)));
        EXPECT_EQ(SortedByGroup(source.owner_filters),
                  testing::OwnerFiltersFromJson(plan.at("owner_filters_by_prefill_rank").at(key)));
        const RegistrationOutcome outcome = planner->OnRegistration(source.prefill_rank, d);
        ASSERT_EQ(outcome.kind, RegistrationOutcome::Kind::kSend);
        EXPECT_EQ(outcome.fragments, source.fragments);
        EXPECT_EQ(outcome.owner_filters, source.owner_filters);
        EXPECT_TRUE(
            ValidateOwnerDecisions(outcome.fragments, outcome.owner_filters, c.prefill.group_specs)
                .ok());
      }
      EXPECT_TRUE(ValidateOwnerCoverage(RangeSendersOf(*route), c.prefill).ok())
          << ValidateOwnerCoverage(RangeSendersOf(*route), c.prefill);
      ++plans;
    }
  }
  EXPECT_GE(plans, 6);
}

// owned_local_pages (dcp_r2.json `sender_selection`): the kept positions, their local pages
// and the decode blocks at the same positions; an id outside [0, virtual_block_count) fails.
TEST(OwnerFilterTest, SenderSelectionCasesMatchTheReference) {
  for (const nlohmann::json& c : Dcp().at("sender_selection")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const int k = c.at("shard_count").get<int>();
    EXPECT_EQ(1 + (c.at("page_count").get<int64_t>() - 1) * k,
              c.at("virtual_block_count").get<int64_t>());  // §12.2
    const OwnerFilter filter{c.at("owner_rank").get<int>(), k};
    const auto source = c.at("source_block_ids").get<std::vector<int64_t>>();
    const auto destination = c.at("destination_block_ids").get<std::vector<int64_t>>();
    absl::StatusOr<OwnedBlocks> owned =
        SelectOwnedBlocks(filter, source, destination, c.at("virtual_block_count").get<int64_t>());
    const nlohmann::json& want = c.at("result");
    if (!want.at("ok").get<bool>()) {
      ASSERT_FALSE(owned.ok());
      EXPECT_EQ(CategoryOf(owned.status()), ErrorCategory::kInvalidManifest);
      EXPECT_TRUE(Mentions(owned.status(), want["error"]["message"].get<std::string>()))
          << owned.status();
      continue;
    }
    ASSERT_TRUE(owned.ok()) << owned.status();
    EXPECT_EQ(owned->positions, want.at("owned_positions").get<std::vector<int64_t>>());
    EXPECT_EQ(owned->source_local_pages, want.at("source_local_pages").get<std::vector<int64_t>>());
    EXPECT_EQ(owned->destination_block_ids,
              want.at("destination_block_ids").get<std::vector<int64_t>>());
  }
}

// validate_rank_owner_filters and CachePageOwnerFilter (dcp_r2.json
// `owner_filter_validation`): the registration checks of §12.7.
TEST(OwnerFilterTest, OwnerFilterValidationCasesMatchTheReference) {
  int checked = 0;
  for (const nlohmann::json& c : Dcp().at("owner_filter_validation")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    absl::Status status;
    if (c.contains("owner_filter")) {
      status = CheckOwnerFilter(
          OwnerFilter{c["owner_filter"][0].get<int>(), c["owner_filter"][1].get<int>()});
    } else {
      std::vector<layout::GroupSpec> specs;
      for (const auto& [group_id, shards] : c.at("group_shard_counts").items()) {
        layout::GroupSpec spec;
        spec.group_id = group_id;
        spec.shard_count = shards.get<int64_t>();
        specs.push_back(spec);
      }
      status = ValidateOwnerDecisions(testing::FragmentsFromJson(c.at("fragments")),
                                      testing::OwnerFiltersFromJson(c.at("owner_filters")), specs);
    }
    const nlohmann::json& want = c.at("result");
    if (want.at("ok").get<bool>()) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      ASSERT_FALSE(status.ok());
      EXPECT_EQ(CategoryOf(status), ErrorCategory::kUnsupportedLayout);
      EXPECT_TRUE(Mentions(status, want["error"]["message"].get<std::string>())) << status;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

TEST(OwnerFilterTest, FragmentsOfAShardedGroupNeedAFilterNotNone) {
  layout::GroupSpec spec;
  spec.group_id = "history";
  spec.shard_count = 2;
  Fragment f;
  f.group_id = "history";
  f.field_id = "layer.0.latent";
  const absl::Status status = ValidateOwnerDecisions({f}, {{"history", std::nullopt}}, {spec});
  ASSERT_FALSE(status.ok());
  EXPECT_TRUE(Mentions(status, "decision is none")) << status;
  EXPECT_FALSE(ValidateOwnerDecisions({}, {{"history", std::nullopt}}, {spec}).ok());
}

TEST(OwnerFilterTest, AShardedGroupFieldWithAHeadPartitionIsRefused) {
  Case c = SnapshotPlannerCase("gqa_kv4_p8_d2");
  c.prefill.group_specs[0].shard_count = 2;
  absl::StatusOr<Planner> planner = Planner::Create(c.p, c.d, c.prefill, c.decode);
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(planner.status(), "has a head partition")) << planner.status();
  EXPECT_TRUE(Mentions(planner.status(), "'full_attention'")) << planner.status();
}

// A rank outside the owner subgroup of every decode rank is a dummy of decode rank 0, with
// every sharded group's decision "none" (§12.7).
TEST(OwnerFilterTest, ADummyCarriesNoneForEveryShardedGroup) {
  const Case c = DcpPlannerCase("p4_dcp2_to_d4");
  absl::StatusOr<Planner> planner = Planner::Create(4, 1, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_EQ(planner->TargetsFor(0)->expected_prefill_ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(planner->TargetsFor(0)->dummy_tp_ranks, (std::vector<int>{2, 3}));
  const RegistrationOutcome dummy = planner->OnRegistration(3, 0);
  ASSERT_EQ(dummy.kind, RegistrationOutcome::Kind::kDummy);
  EXPECT_EQ(dummy.owner_filters, (std::vector<GroupOwnerFilter>{{"history", std::nullopt}}));
}

TEST(OwnerFilterTest, BindRefusesDecisionsThatBreakTheRegistrationChecks) {
  const Case c = DcpPlannerCase("p4_dcp4_to_d1");
  Planner planner = *Planner::Create(c.p, c.d, c.prefill, c.decode);
  const RegistrationOutcome outcome = planner.OnRegistration(2, 0);
  ASSERT_EQ(outcome.kind, RegistrationOutcome::Kind::kSend);
  EXPECT_TRUE(CopyPlan::Bind(c.prefill, c.decode, outcome.fragments, outcome.owner_filters).ok());
  absl::StatusOr<CopyPlan> unfiltered = CopyPlan::Bind(c.prefill, c.decode, outcome.fragments);
  ASSERT_FALSE(unfiltered.ok());
  EXPECT_EQ(CategoryOf(unfiltered.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_TRUE(Mentions(unfiltered.status(), "no owner-filter decision")) << unfiltered.status();
  absl::StatusOr<CopyPlan> wrong_count =
      CopyPlan::Bind(c.prefill, c.decode, outcome.fragments, {{"history", OwnerFilter{0, 2}}});
  ASSERT_FALSE(wrong_count.ok());
  EXPECT_TRUE(Mentions(wrong_count.status(), "disagrees with its shard count 4"))
      << wrong_count.status();
}

// ---- Byte level: every block of the decode's pages is written exactly once, with the bytes
// of the virtual block the prefill's manifest names at that position.

int64_t ArenaExtent(const layout::Contract& c) {
  int64_t end = 0;
  for (const layout::FieldLayout& f : c.plan.fields) {
    const int64_t last = c.FindGroup(f.group_id)->page_count - 1;
    end = std::max(end, *layout::PageOffset(c, f, last) + layout::PayloadBytes(f));
  }
  return end;
}

// The byte `b` of field `field` of logical (virtual) block `v`: what every copy must carry.
uint8_t Pattern(size_t field, int64_t v, int64_t b) {
  return static_cast<uint8_t>(field * 131 + v * 29 + b * 7 + 1);
}

// Prefill rank `rank`'s arena: each local page L of field f holds the pattern of the virtual
// block it stores, (L - 1) * k + (rank mod k) + 1 for a sharded group, L otherwise.
std::vector<uint8_t> PrefillArena(const layout::Contract& c, int rank) {
  std::vector<uint8_t> arena(ArenaExtent(c), 0);
  for (size_t fi = 0; fi < c.plan.fields.size(); ++fi) {
    const layout::FieldLayout& f = c.plan.fields[fi];
    const int64_t k = c.FindGroupSpec(f.group_id)->shard_count;
    for (int64_t page = 1; page < c.FindGroup(f.group_id)->page_count; ++page) {
      const int64_t v = (page - 1) * k + rank % k + 1;
      const int64_t at = *layout::PageOffset(c, f, page);
      for (int64_t b = 0; b < layout::PayloadBytes(f); ++b) arena[at + b] = Pattern(fi, v, b);
    }
  }
  return arena;
}

// A room: per group, `positions` distinct virtual source ids spread over every owner, and
// distinct decode blocks.
std::pair<layout::Manifest, layout::Manifest> Room(const Case& c) {
  layout::Manifest src, dst;
  for (const layout::GroupSpec& spec : c.prefill.group_specs) {
    const int64_t virtual_ids = c.prefill.VirtualBlockCount(spec.group_id);
    const int64_t dst_pages = c.decode.FindGroup(spec.group_id)->page_count;
    const int64_t positions = std::min(virtual_ids, dst_pages) - 1;
    layout::ManifestGroup s{spec.group_id, {}}, t{spec.group_id, {}};
    for (int64_t i = 0; i < positions; ++i) {
      s.block_ids.push_back(virtual_ids - 1 - (i * 7) % (virtual_ids - 1));  // scattered, distinct
      t.block_ids.push_back(1 + (i + 2) % (dst_pages - 1));                  // rotated, distinct
    }
    src.groups.push_back(std::move(s));
    dst.groups.push_back(std::move(t));
  }
  return {src, dst};
}

void ExpectShardedRoomLandsExactlyOnce(const Case& c) {
  SCOPED_TRACE(c.name);
  absl::StatusOr<Planner> planner = Planner::Create(c.p, c.d, c.prefill, c.decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  ASSERT_FALSE(planner->sharded_group_ids().empty());
  const auto [src_room, dst_room] = Room(c);
  for (int d = 0; d < c.d; ++d) {
    SCOPED_TRACE(absl::StrCat("d=", d));
    absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
    ASSERT_TRUE(route.ok()) << route.status();
    std::vector<uint8_t> landed(ArenaExtent(c.decode), 0);
    std::vector<int> writes(landed.size(), 0);
    for (const SourceFragments& source : route->sources) {
      const RegistrationOutcome outcome = planner->OnRegistration(source.prefill_rank, d);
      ASSERT_EQ(outcome.kind, RegistrationOutcome::Kind::kSend);
      absl::StatusOr<CopyPlan> plan =
          CopyPlan::Bind(c.prefill, c.decode, outcome.fragments, outcome.owner_filters);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::vector<uint8_t> arena = PrefillArena(c.prefill, source.prefill_rank);
      CopyList copies;
      ASSERT_TRUE(plan->ExpandCoalesced(src_room, dst_room, copies).ok());
      ASSERT_LE(static_cast<int64_t>(copies.size()), plan->CountCopies(src_room));
      for (const Copy& copy : copies) {
        ASSERT_LE(copy.src_offset + copy.length, arena.size());
        ASSERT_LE(copy.dst_offset + copy.length, landed.size());
        for (uint64_t i = 0; i < copy.length; ++i) {
          landed[copy.dst_offset + i] = arena[copy.src_offset + i];
          ++writes[copy.dst_offset + i];
        }
      }
    }
    // Every payload byte of every decode block of the room holds the named virtual block's
    // byte, written once; nothing else is written.
    std::vector<int> expected(landed.size(), 0);
    for (size_t g = 0; g < c.prefill.group_specs.size(); ++g) {
      const std::string& group_id = c.prefill.group_specs[g].group_id;
      for (size_t fi = 0; fi < c.decode.plan.fields.size(); ++fi) {
        const layout::FieldLayout& f = c.decode.plan.fields[fi];
        if (f.group_id != group_id) continue;
        for (size_t i = 0; i < src_room.groups[g].block_ids.size(); ++i) {
          const int64_t v = src_room.groups[g].block_ids[i];
          const int64_t at = *layout::PageOffset(c.decode, f, dst_room.groups[g].block_ids[i]);
          for (int64_t b = 0; b < layout::PayloadBytes(f); ++b) {
            ++expected[at + b];
            ASSERT_EQ(writes[at + b], 1) << f.field_id << " position " << i << " byte " << b;
            ASSERT_EQ(landed[at + b], Pattern(fi, v, b)) << f.field_id << " position " << i;
          }
        }
      }
    }
    EXPECT_EQ(writes, expected);
  }
}

TEST(OwnerFilterTest, ShardedRouteWritesEveryDecodeBlockExactlyOnce) {
  ExpectShardedRoomLandsExactlyOnce(DcpPlannerCase("p4_dcp4_to_d1"));
  ExpectShardedRoomLandsExactlyOnce(DcpPlannerCase("p4_dcp2_to_d4"));
  ExpectShardedRoomLandsExactlyOnce(DcpPlannerCase("p2_dcp2_equal_tp"));
  for (int k : {2, 4}) {
    Case c = SnapshotPlannerCase("mla_p4_d2");
    c.name = absl::StrCat(c.name, " k=", k);
    c.prefill.group_specs[0].shard_count = k;
    ExpectShardedRoomLandsExactlyOnce(c);
  }
}

TEST(OwnerFilterTest, ASourceIdBeyondTheVirtualBlockCountFailsTheRoom) {
  const Case c = DcpPlannerCase("p4_dcp4_to_d1");
  Planner planner = *Planner::Create(c.p, c.d, c.prefill, c.decode);
  const RegistrationOutcome outcome = planner.OnRegistration(1, 0);
  CopyPlan plan = *CopyPlan::Bind(c.prefill, c.decode, outcome.fragments, outcome.owner_filters);
  auto [src, dst] = Room(c);
  const int64_t virtual_ids = c.prefill.VirtualBlockCount("history");
  src.groups[0].block_ids[0] = virtual_ids;
  CopyList copies;
  const absl::Status status = plan.Expand(src, dst, copies);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidManifest);
  EXPECT_TRUE(copies.empty());
  src.groups[0].block_ids[0] = virtual_ids - 1;  // the last virtual id is a page
  EXPECT_TRUE(plan.Expand(src, dst, copies).ok());
}

std::string ReadExample(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string path = srcdir != nullptr ? absl::StrCat(srcdir, "/kvrail/examples/", name)
                                             : absl::StrCat("examples/", name);
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// docs/owner-filters.md "Worked example", as the doc states it.
TEST(OwnerFilterTest, WorkedExampleOfTheDoc) {
  const layout::Contract prefill =
      testing::ReadR2Contract("dcp_prefill_tp4", ReadExample("dcp_prefill_tp4.json"));
  const layout::Contract decode =
      testing::ReadR2Contract("dcp_decode", ReadExample("dcp_decode.json"));
  absl::StatusOr<Planner> planner = Planner::Create(4, 2, prefill, decode);
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_EQ(planner->TargetsFor(0)->target_tp_ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(planner->TargetsFor(1)->target_tp_ranks, (std::vector<int>{2, 3}));
  EXPECT_TRUE(planner->TargetsFor(0)->dummy_tp_ranks.empty());
  EXPECT_EQ(planner->RequiredCompletions(0), 2);
  EXPECT_EQ(planner->RequiredCompletions(1), 2);
  const Route route = *planner->PlanForDecodeRank(0);
  ASSERT_EQ(route.sources.size(), 2u);
  for (const SourceFragments& source : route.sources) {
    EXPECT_EQ(source.fragments.size(), 2u);
    EXPECT_EQ(source.owner_filters,
              (std::vector<GroupOwnerFilter>{{"history", OwnerFilter{source.prefill_rank, 2}}}));
  }

  absl::StatusOr<layout::Manifest> src =
      layout::ParseManifest(ReadExample("dcp_prefill_manifest.json"));
  absl::StatusOr<layout::Manifest> dst =
      layout::ParseManifest(ReadExample("dcp_decode_manifest.json"));
  ASSERT_TRUE(src.ok() && dst.ok());
  EXPECT_EQ(layout::LogicalSlots(prefill.group_specs[0], 0, 4).size(), 4);
  struct Want {
    int rank;
    std::vector<int64_t> positions, local_pages, decode_blocks;
  };
  for (const Want& want : {Want{0, {0, 2}, {2, 3}, {1, 3}}, Want{1, {1, 3}, {2, 3}, {2, 4}}}) {
    SCOPED_TRACE(absl::StrCat("prefill rank ", want.rank));
    const RegistrationOutcome outcome = planner->OnRegistration(want.rank, 0);
    const OwnerFilter* filter = FindOwnerFilter(outcome.owner_filters, "history");
    ASSERT_NE(filter, nullptr);
    absl::StatusOr<OwnedBlocks> owned =
        SelectOwnedBlocks(*filter, src->groups[0].block_ids, dst->groups[0].block_ids,
                          prefill.VirtualBlockCount("history"));
    ASSERT_TRUE(owned.ok()) << owned.status();
    EXPECT_EQ(owned->positions, want.positions);
    EXPECT_EQ(owned->source_local_pages, want.local_pages);
    EXPECT_EQ(owned->destination_block_ids, want.decode_blocks);
    // The copy plan writes those pages, field by field, and nothing else.
    CopyPlan plan = *CopyPlan::Bind(prefill, decode, outcome.fragments, outcome.owner_filters);
    CopyList copies;
    ASSERT_TRUE(plan.Expand(*src, *dst, copies).ok());
    std::vector<Copy> expected;
    for (const layout::FieldLayout* f : prefill.FieldsOfGroup("history")) {
      for (size_t i = 0; i < want.positions.size(); ++i) {
        expected.push_back(
            Copy{static_cast<uint64_t>(*layout::PageOffset(prefill, *f, want.local_pages[i])),
                 static_cast<uint64_t>(*layout::PageOffset(decode, *decode.FindField(f->field_id),
                                                           want.decode_blocks[i])),
                 static_cast<uint64_t>(layout::PayloadBytes(*f))});
      }
    }
    ASSERT_EQ(copies.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(copies.begin()[i].src_offset, expected[i].src_offset) << i;
      EXPECT_EQ(copies.begin()[i].dst_offset, expected[i].dst_offset) << i;
      EXPECT_EQ(copies.begin()[i].length, expected[i].length) << i;
    }
  }
}

TEST(OwnerFilterTest, CoverageRejectsGapsDuplicatesAndForeignOwners) {
  Case c = SnapshotPlannerCase("mla_p4_d2");
  c.prefill.group_specs[0].shard_count = 2;
  const std::string g = c.prefill.group_specs[0].group_id;
  const OwnerFilter o0{0, 2}, o1{1, 2};
  auto sender = [](int rank, const std::string& group, const OwnerFilter* f) {
    return RangeSender{rank, group, "layer.0.k", 0, 16, 16, 1, f};
  };
  EXPECT_TRUE(ValidateOwnerCoverage({sender(0, g, &o0), sender(1, g, &o1)}, c.prefill).ok());
  EXPECT_FALSE(ValidateOwnerCoverage({sender(0, g, &o0)}, c.prefill).ok());  // gap
  EXPECT_FALSE(
      ValidateOwnerCoverage({sender(0, g, &o0), sender(2, g, &o0)}, c.prefill).ok());  // twice
  EXPECT_FALSE(
      ValidateOwnerCoverage({sender(1, g, &o0), sender(0, g, &o1)}, c.prefill).ok());  // not theirs
  EXPECT_FALSE(ValidateOwnerCoverage({sender(0, "h", &o0)}, c.prefill).ok());          // unsharded
  EXPECT_TRUE(ValidateOwnerCoverage({sender(0, "h", nullptr)}, c.prefill).ok());
}

TEST(OwnerFilterTest, OwnershipFollowsTheVirtualIdNotThePosition) {
  // §12.8: id v > 0 is owner (v - 1) mod k's local page (v - 1) div k + 1; id 0 is nobody's.
  const OwnerFilter o1{1, 4};
  EXPECT_TRUE(o1.Owns(2));
  EXPECT_TRUE(o1.Owns(6));
  EXPECT_FALSE(o1.Owns(1));
  EXPECT_FALSE(o1.Owns(0));
  EXPECT_EQ(o1.LocalPage(2), 1);
  EXPECT_EQ(o1.LocalPage(6), 2);
}

}  // namespace
}  // namespace kvrail::plan
