#include "control/layout/kv_shape.h"

#include <gtest/gtest.h>

#include "control/layout/contract.h"

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
