#include "control/plan/landing_copies.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "control/layout/kv_shape.h"
#include "control/plan/pipeline.h"
#include "control/plan/planner.h"
#include "control/plan/room_digest.h"

namespace kvrail::plan {
namespace {

layout::KvShape Shape() {
  layout::KvShape shape;
  shape.layers = 4;
  shape.kv_heads = 4;
  shape.head_dim = 8;
  shape.pages = 24;
  return shape;
}

// A room of `blocks` blocks at `first`, `first` + 2, ... (scattered, so nothing coalesces
// across pages by accident).
layout::Manifest Room(const layout::Contract& contract, int64_t first, int blocks) {
  std::vector<int64_t> ids;
  for (int i = 0; i < blocks; ++i) ids.push_back(first + 2 * i);
  const std::vector<std::vector<int64_t>> table = {ids};
  return layout::BuildManifest(contract, table, 0, blocks * 16).value();
}

// Every destination row the copies write, as (offset, length), sorted: what lands, whichever
// way the copies group the rows.
std::vector<std::pair<uint64_t, uint64_t>> MergedRows(const CopyList& copies) {
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  for (const Copy& c : copies) {
    ForEachRow(c, [&](uint64_t, uint64_t dst, uint64_t length) { rows.push_back({dst, length}); });
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

struct Case {
  const char* name;
  int prefill_tp;
  int decode_tp;
  int pp;
};

class LandingCopiesTest : public ::testing::TestWithParam<Case> {};

// What a prefill rank of the case writes (its own planner, OnRegistration, Bind and the
// coalesced expansion over its source manifest) lands exactly where the decode's derivation
// says: the prefill's source digest equals the decode's digest of what landed.
TEST_P(LandingCopiesTest, ThePrefillsSourceDigestEqualsTheDecodesDigestOfWhatLanded) {
  const Case c = GetParam();
  const layout::Contract prefill = layout::BuildKvContract(Shape(), c.prefill_tp).value();
  const layout::Contract decode = layout::BuildKvContract(Shape(), c.decode_tp).value();
  PrefillDescription node;
  node.pp_size = c.pp;
  node.stage_tp_size = c.prefill_tp;
  node.world_size = c.prefill_tp * c.pp;
  node.contract = prefill;
  // The fields in plan order, cut into c.pp runs (layers stay whole: k and v come in pairs).
  const std::vector<std::string> fields = PipelineLayout::SingleStage(prefill).fields_by_stage[0];
  node.pipeline.pp_size = c.pp;
  node.pipeline.fields_by_stage.resize(c.pp);
  for (size_t i = 0; i < fields.size(); ++i) {
    node.pipeline.fields_by_stage[i * c.pp / fields.size()].push_back(fields[i]);
  }
  const layout::Manifest src = Room(prefill, 1, 5);
  const layout::Manifest dst = Room(decode, 4, 5);
  for (int d = 0; d < c.decode_tp; ++d) {
    for (int stage = 0; stage < c.pp; ++stage) {
      const StageFilter filter = node.pipeline.FilterFor(stage);
      const Planner planner =
          Planner::Create(c.prefill_tp, c.decode_tp, prefill, decode, c.pp > 1 ? &filter : nullptr)
              .value();
      for (int p = 0; p < c.prefill_tp; ++p) {
        const RegistrationOutcome outcome = planner.OnRegistration(p, d);
        const int rank = GlobalPrefillRank(stage, c.prefill_tp, p);
        absl::StatusOr<CopyPlan> landing = LandingPlan(node, c.decode_tp, d, decode, rank);
        if (outcome.kind != RegistrationOutcome::Kind::kSend) {
          EXPECT_FALSE(landing.ok()) << "rank " << rank << " sends decode rank " << d << " nothing";
          continue;
        }
        ASSERT_TRUE(landing.ok()) << landing.status();
        // The prefill's side, as PrefillRooms and the sidecar do it.
        const CopyPlan sent =
            CopyPlan::Bind(prefill, decode, outcome.fragments, outcome.owner_filters).value();
        CopyList written;
        ASSERT_TRUE(sent.ExpandCoalesced(src, dst, written).ok());
        std::vector<uint8_t> source(prefill.ArenaBytes());
        std::mt19937 random(rank * 31 + d);
        for (uint8_t& b : source) b = static_cast<uint8_t>(random());
        std::vector<uint8_t> landed(decode.ArenaBytes(), 0);
        for (const Copy& w : written) {
          std::copy_n(&source[w.src_offset], w.length, &landed[w.dst_offset]);
        }
        CopyList derived;
        ASSERT_TRUE(LandingCopies(*landing, dst, derived).ok());
        ASSERT_FALSE(derived.empty());
        const uint64_t sent_digest = RoomDigest(written, DigestSide::kSource, source).value();
        const uint64_t landed_digest =
            RoomDigest(derived, DigestSide::kDestination, landed).value();
        EXPECT_EQ(sent_digest, landed_digest) << "prefill rank " << rank << ", decode rank " << d;
        // With `strided`, a page's rows are one copy (a staged arena's landed ranges): the same
        // destination bytes, in fewer copies wherever the route slices heads.
        CopyList strided;
        ASSERT_TRUE(LandingCopies(*landing, dst, strided, /*strided=*/true).ok());
        EXPECT_EQ(MergedRows(strided), MergedRows(derived)) << "prefill rank " << rank;
        if (c.prefill_tp != c.decode_tp) EXPECT_LT(strided.size(), derived.size());
        // LandingBytes: what they land, from the envelope alone (a row staging slot's size).
        uint64_t payload = 0;
        for (const Copy& copy : derived) payload += PayloadBytes(copy);
        EXPECT_EQ(LandingBytes(std::make_shared<const CopyPlan>(*landing), dst).value(), payload);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Routes, LandingCopiesTest,
                         ::testing::Values(Case{"p1_d1", 1, 1, 1}, Case{"p2_d1", 2, 1, 1},
                                           Case{"p1_d2", 1, 2, 1}, Case{"p4_d2", 4, 2, 1},
                                           Case{"p2_d2_two_stages", 2, 2, 2},
                                           Case{"p2_d1_two_stages", 2, 1, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(LandingPlanTest, ARankOutsideTheNodeIsRefusedNamingIt) {
  PrefillDescription node;
  node.contract = layout::BuildKvContract(Shape(), 1).value();
  absl::StatusOr<CopyPlan> plan = LandingPlan(node, 1, 0, node.contract, 3);
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(absl::StrContains(plan.status().message(),
                                "copies of prefill rank 3: the node has 1 stage(s) of 1 rank(s)"))
      << plan.status();
}

}  // namespace
}  // namespace kvrail::plan
