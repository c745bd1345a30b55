#include "control/layout/kv_shape.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"

namespace kvrail::layout {
namespace {

TEST(KvShapeTest, BuildsAValidRecipeArenaThatRoundTripsAndPairsAcrossTp) {
  KvShape shape;
  shape.layers = 4;
  shape.pages = 10;
  auto tp1 = BuildKvContract(shape, 1);
  auto tp2 = BuildKvContract(shape, 2);
  ASSERT_TRUE(tp1.ok()) << tp1.status();
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_EQ(tp1->plan.fields.size(), 8u);
  EXPECT_EQ(tp1->plan.fields[0].shape, (std::vector<int64_t>{16, 8, 128}));
  EXPECT_EQ(tp2->plan.fields[0].shape, (std::vector<int64_t>{16, 4, 128}));
  EXPECT_EQ(FieldPageBytes(shape, 1), 16 * 8 * 128 * 2);
  EXPECT_EQ(tp1->ArenaBytes(), 11 * 8 * FieldPageBytes(shape, 1));
  EXPECT_TRUE(CheckPeerContracts(*tp2, *tp1).ok());
  auto wire = SerializeContract(*tp2);
  ASSERT_TRUE(wire.ok());
  auto parsed = ParseContract(*wire);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(SerializeContract(*parsed).value(), *wire);
}

// A hybrid: sliding-window attention on even layers, a recurrent state on odd ones; valid,
// round-tripping, pairing across TP, and its manifests keep the window and one snapshot.
TEST(KvShapeTest, AHybridHasASlidingWindowGroupAndAStateGroup) {
  KvShape shape;
  shape.layers = 4;
  shape.pages = 512;
  shape.sliding_window_tokens = 4096;
  shape.state_dim = 64;
  auto tp1 = BuildKvContract(shape, 1);
  auto tp2 = BuildKvContract(shape, 2);
  ASSERT_TRUE(tp1.ok()) << tp1.status();
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  ASSERT_EQ(tp1->group_specs.size(), 2u);
  EXPECT_EQ(tp1->group_specs[0].group_id, "sliding_window");
  EXPECT_EQ(tp1->group_specs[0].retention, Retention::kSlidingWindow);
  EXPECT_EQ(tp1->group_specs[1].group_id, "state");
  EXPECT_EQ(tp1->group_specs[1].transfer_policy, TransferPolicy::kLatestSnapshot);
  std::vector<std::string> ids;
  for (const FieldLayout& f : tp1->plan.fields) ids.push_back(f.field_id);
  EXPECT_EQ(ids, (std::vector<std::string>{"layer.0.k", "layer.0.v", "layer.1.state", "layer.2.k",
                                           "layer.2.v", "layer.3.state"}));
  EXPECT_EQ(tp2->FindField("layer.1.state")->shape, (std::vector<int64_t>{4, 64, 128}));
  ASSERT_NE(tp2->FindPartition("layer.1.state"), nullptr);
  EXPECT_EQ(tp2->FindPartition("layer.1.state")->axis, 0);
  EXPECT_TRUE(CheckPeerContracts(*tp2, *tp1).ok());
  auto parsed = ParseContract(SerializeContract(*tp1).value());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // 8192 tokens: the window keeps its last 4096 (256 pages, and the page it starts in), the
  // state one snapshot.
  EXPECT_GE(LogicalSlots(tp1->group_specs[0], 0, 8192).size(), 256);
  EXPECT_LE(LogicalSlots(tp1->group_specs[0], 0, 8192).size(), 257);
  EXPECT_EQ(LogicalSlots(tp1->group_specs[1], 0, 8192).size(), 1);
  shape.latent = true;
  EXPECT_FALSE(BuildKvContract(shape, 1).ok());
}

TEST(KvShapeTest, LatentFieldsAreReplicated) {
  KvShape shape;
  shape.layers = 2;
  shape.latent = true;
  auto contract = BuildKvContract(shape, 4);
  ASSERT_TRUE(contract.ok()) << contract.status();
  EXPECT_EQ(contract->plan.fields.size(), 2u);
  EXPECT_TRUE(contract->transfer_schema.empty());
  EXPECT_EQ(contract->plan.fields[1].field_id, "layer.1.latent");
}

TEST(KvShapeTest, RejectsBadCountsNamingTheMember) {
  KvShape shape;
  shape.kv_heads = 6;
  auto bad = BuildKvContract(shape, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a multiple of tp_size 4"), std::string::npos);
  shape = KvShape();
  shape.layers = 0;
  bad = BuildKvContract(shape, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layers"), std::string::npos);
  shape = KvShape();
  shape.pages = int64_t{1} << 50;
  EXPECT_FALSE(BuildKvContract(shape, 1).ok());
}

}  // namespace
}  // namespace kvrail::layout
