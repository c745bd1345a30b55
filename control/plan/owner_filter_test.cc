#include "control/plan/owner_filter.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/plan/route.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

struct Case {
  layout::Contract prefill;
  layout::Contract decode;
  int p = 1;
  int d = 1;
};

Case PlannerCase(const std::string& name) {
  const nlohmann::json vectors = kvrail::testing::LoadVectors("planner.json");
  for (const auto& c : vectors["cases"]) {
    if (c["name"] == name) {
      return {*layout::ParseContract(c["prefill_contract"].get<std::string>()),
              *layout::ParseContract(c["decode_contract"].get<std::string>()),
              c["prefill_tp_size"].get<int>(), c["decode_tp_size"].get<int>()};
    }
  }
  ADD_FAILURE() << "no planner case " << name;
  return {};
}

std::vector<ShardedGroup> ShardEveryGroup(const layout::Contract& c, int owners) {
  std::vector<ShardedGroup> sharded;
  for (const layout::GroupSpec& spec : c.group_specs) sharded.push_back({spec.group_id, owners});
  return sharded;
}

int64_t ArenaExtent(const layout::Contract& c) {
  int64_t end = 0;
  for (const layout::FieldLayout& f : c.plan.fields) {
    const int64_t last = c.FindGroup(f.group_id)->page_count - 1;
    end = std::max(end, *layout::PageOffset(c, f, last) + layout::PayloadBytes(f));
  }
  return end;
}

// One room: prefix 0, `prompt` tokens, distinct ascending block ids on each side.
layout::Manifest Room(const layout::Contract& c, int64_t prompt, int64_t first_block) {
  std::vector<std::vector<int64_t>> tables;
  for (const layout::GroupSpec& spec : c.group_specs) {
    std::vector<int64_t> table(64);
    std::iota(table.begin(), table.end(), first_block);
    const int64_t pages = c.FindGroup(spec.group_id)->page_count;
    for (int64_t& id : table) id = 1 + (id - 1) % (pages - 1);
    tables.push_back(table);
  }
  return *layout::BuildManifest(c, tables, 0, prompt);
}

// The heart of §10.3: with every group sharded, the decode's pages are written exactly once,
// every block by the rank that owns it; every rank of an owner subgroup serves.
void ExpectShardedRoomWrittenExactlyOnce(const std::string& name, int owners) {
  SCOPED_TRACE(name);
  Case c = PlannerCase(name);
  const std::vector<ShardedGroup> sharded = ShardEveryGroup(c.prefill, owners);
  absl::StatusOr<Planner> planner =
      Planner::Create(c.p, c.d, c.prefill, c.decode, nullptr, sharded);
  ASSERT_TRUE(planner.ok()) << planner.status();
  const layout::Manifest src_room = Room(c.prefill, 37, 3);
  const layout::Manifest dst_room = Room(c.decode, 37, 9);
  for (int d = 0; d < c.d; ++d) {
    absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
    ASSERT_TRUE(route.ok()) << route.status();
    ASSERT_TRUE(ValidateOwnerCoverage(RangeSendersOf(*route), sharded).ok())
        << ValidateOwnerCoverage(RangeSendersOf(*route), sharded);
    std::vector<int> writes(ArenaExtent(c.decode), 0);
    for (const SourceFragments& source : route->sources) {
      ASSERT_FALSE(source.owner_filters.empty());
      RegistrationOutcome outcome = planner->OnRegistration(source.prefill_rank, d);
      ASSERT_EQ(outcome.kind, RegistrationOutcome::Kind::kSend);
      EXPECT_EQ(outcome.owner_filters.size(), source.owner_filters.size());
      absl::StatusOr<CopyPlan> plan =
          CopyPlan::Bind(c.prefill, c.decode, source.fragments, source.owner_filters);
      ASSERT_TRUE(plan.ok()) << plan.status();
      CopyList copies;
      ASSERT_TRUE(plan->Expand(src_room, dst_room, copies).ok());
      for (const Copy& copy : copies) {
        for (uint64_t i = 0; i < copy.length; ++i) ++writes[copy.dst_offset + i];
      }
    }
    // Every destination byte some unsharded plan would write is written exactly once.
    absl::StatusOr<Planner> plain = Planner::Create(c.p, c.d, c.prefill, c.decode);
    ASSERT_TRUE(plain.ok());
    std::vector<int> want(writes.size(), 0);
    const Route plain_route = *plain->PlanForDecodeRank(d);
    for (const SourceFragments& source : plain_route.sources) {
      CopyPlan plan = *CopyPlan::Bind(c.prefill, c.decode, source.fragments);
      CopyList copies;
      ASSERT_TRUE(plan.Expand(src_room, dst_room, copies).ok());
      for (const Copy& copy : copies) {
        for (uint64_t i = 0; i < copy.length; ++i) ++want[copy.dst_offset + i];
      }
    }
    for (size_t i = 0; i < writes.size(); ++i) {
      ASSERT_EQ(writes[i], want[i]) << "decode rank " << d << " byte " << i;
    }
  }
  // Every prefill rank serves somebody: a sharded source is never idle.
  for (int p = 0; p < c.p; ++p) {
    EXPECT_FALSE(planner->DecodeRanksServedBy(p).empty()) << "prefill rank " << p;
  }
}

TEST(OwnerFilterTest, GqaReplicasShareBlocksOfTheirShard) {
  ExpectShardedRoomWrittenExactlyOnce("gqa_kv4_p8_d2", 2);
}

TEST(OwnerFilterTest, ReplicatedFieldsTakeTheWholeOwnerSubgroup) {
  ExpectShardedRoomWrittenExactlyOnce("mla_p4_d2", 2);
  ExpectShardedRoomWrittenExactlyOnce("mla_p4_d2", 4);
}

TEST(OwnerFilterTest, EqualTpRoutesByFragmentsWhenSharded) {
  Case c = PlannerCase("dsa_p8_d8");
  absl::StatusOr<Planner> planner =
      Planner::Create(c.p, c.d, c.prefill, c.decode, nullptr, ShardEveryGroup(c.prefill, 4));
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_FALSE(planner->whole_field_copy());
  ExpectShardedRoomWrittenExactlyOnce("dsa_p8_d8", 4);
}

TEST(OwnerFilterTest, OwnersMustDivideTheReplicaGroup) {
  Case c = PlannerCase("gqa_kv4_p8_d2");  // 4 shards on 8 ranks: replica groups of 2
  absl::StatusOr<Planner> planner =
      Planner::Create(c.p, c.d, c.prefill, c.decode, nullptr, ShardEveryGroup(c.prefill, 4));
  ASSERT_FALSE(planner.ok());
  EXPECT_EQ(CategoryOf(planner.status()), ErrorCategory::kUnsupportedLayout);
  EXPECT_NE(planner.status().message().find("replicas"), absl::string_view::npos);
}

TEST(OwnerFilterTest, DeclarationsAreChecked) {
  Case c = PlannerCase("mla_p4_d2");
  const std::string group = c.prefill.group_specs[0].group_id;
  EXPECT_FALSE(ValidateShardedGroups({{"nope", 2}}, c.prefill, 4).ok());
  EXPECT_FALSE(ValidateShardedGroups({{group, 3}}, c.prefill, 4).ok());
  EXPECT_FALSE(ValidateShardedGroups({{group, 1}}, c.prefill, 4).ok());
  EXPECT_FALSE(ValidateShardedGroups({{group, 2}, {group, 2}}, c.prefill, 4).ok());
  EXPECT_TRUE(ValidateShardedGroups({{group, 2}}, c.prefill, 4).ok());
}

TEST(OwnerFilterTest, CoverageRejectsGapsDuplicatesAndForeignOwners) {
  const std::vector<ShardedGroup> sharded = {{"g", 2}};
  const OwnerFilter o0{2, 0}, o1{2, 1};
  auto sender = [](int rank, const char* group, const OwnerFilter* f) {
    return RangeSender{rank, group, "layer.0.k", 0, 16, 16, 1, f};
  };
  EXPECT_TRUE(ValidateOwnerCoverage({sender(0, "g", &o0), sender(1, "g", &o1)}, sharded).ok());
  EXPECT_FALSE(ValidateOwnerCoverage({sender(0, "g", &o0)}, sharded).ok());  // gap
  EXPECT_FALSE(
      ValidateOwnerCoverage({sender(0, "g", &o0), sender(2, "g", &o0)}, sharded).ok());  // twice
  EXPECT_FALSE(ValidateOwnerCoverage({sender(1, "g", &o0), sender(0, "g", &o1)}, sharded)
                   .ok());                                                   // not theirs
  EXPECT_FALSE(ValidateOwnerCoverage({sender(0, "h", &o0)}, sharded).ok());  // unsharded group
  EXPECT_TRUE(ValidateOwnerCoverage({sender(0, "h", nullptr)}, sharded).ok());
}

TEST(OwnerFilterTest, OwnershipFollowsTheSlotNotThePosition) {
  // With a 4-token prefix on 4-token blocks, manifest position 0 is slot 1: owner 1's block.
  Case c = PlannerCase("mla_p4_d2");
  layout::GroupSpec spec = c.prefill.group_specs[0];
  const int64_t g = spec.block_granularity();
  layout::SlotRange slots = layout::LogicalSlots(spec, g, 5 * g);
  ASSERT_EQ(slots.begin, 1);
  EXPECT_TRUE((OwnerFilter{2, 1}).Owns(slots.begin + 0));
  EXPECT_FALSE((OwnerFilter{2, 0}).Owns(slots.begin + 0));
}

}  // namespace
}  // namespace kvrail::plan
