#include "cluster/kv_pattern.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "control/layout/kv_shape.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"

namespace kvrail::sim {
namespace {

layout::Manifest Room(const layout::Contract& contract, std::vector<int64_t> blocks,
                      int page_tokens) {
  const int64_t prompt = static_cast<int64_t>(blocks.size()) * page_tokens;
  const std::vector<std::vector<int64_t>> table = {std::move(blocks)};
  return layout::BuildManifest(contract, table, 0, prompt).value();
}

// Prefill TP `p_tp` fills, the planned copies move (memcpy), decode TP `d_tp` checks.
void RoundTrip(int p_tp, int d_tp, bool latent) {
  layout::KvShape shape;
  shape.layers = 2;
  shape.pages = 12;
  shape.latent = latent;
  shape.latent_dim = 64;
  const layout::Contract prefill = layout::BuildKvContract(shape, p_tp).value();
  const layout::Contract decode = layout::BuildKvContract(shape, d_tp).value();
  const plan::Planner planner = plan::Planner::Create(p_tp, d_tp, prefill, decode).value();
  const uint64_t room = 77;
  const layout::Manifest src = Room(prefill, {1, 2, 3, 4, 5}, shape.page_tokens);
  const layout::Manifest dst = Room(decode, {9, 3, 11, 1, 6}, shape.page_tokens);
  std::vector<std::vector<uint8_t>> prefill_arenas(p_tp), decode_arenas(d_tp);
  for (int p = 0; p < p_tp; ++p) {
    prefill_arenas[p].assign(prefill.ArenaBytes(), 0);
    const RankLayout rank = RankLayout::Create(prefill, p_tp, p).value();
    ASSERT_TRUE(rank.Fill(src, room, absl::MakeSpan(prefill_arenas[p])).ok());
  }
  for (int d = 0; d < d_tp; ++d) {
    decode_arenas[d].assign(decode.ArenaBytes(), 0);
    for (int p = 0; p < p_tp; ++p) {
      const plan::RegistrationOutcome outcome = planner.OnRegistration(p, d);
      if (outcome.kind != plan::RegistrationOutcome::Kind::kSend) continue;
      const plan::CopyPlan copy_plan =
          plan::CopyPlan::Bind(prefill, decode, outcome.fragments, outcome.owner_filters).value();
      plan::CopyList copies;
      ASSERT_TRUE(copy_plan.Expand(src, dst, copies).ok());
      for (const plan::Copy& c : copies) {
        std::memcpy(&decode_arenas[d][c.dst_offset], &prefill_arenas[p][c.src_offset], c.length);
      }
    }
    const RankLayout rank = RankLayout::Create(decode, d_tp, d).value();
    const absl::Status checked = rank.Check(dst, room, decode_arenas[d]);
    ASSERT_TRUE(checked.ok()) << checked;
    // The digest of what arrived equals the digest of the pattern itself.
    EXPECT_EQ(rank.Digest(dst, room, decode_arenas[d]), rank.Digest(dst, room, {}));
    // Another room's pattern does not match.
    EXPECT_FALSE(rank.Check(dst, room + 1, decode_arenas[d]).ok());
  }
}

TEST(KvPatternTest, HeadSlicedPrefillTp2ToDecodeTp1) { RoundTrip(2, 1, false); }
TEST(KvPatternTest, HeadSlicedPrefillTp1ToDecodeTp2) { RoundTrip(1, 2, false); }
TEST(KvPatternTest, EqualTp) { RoundTrip(2, 2, false); }
TEST(KvPatternTest, ReplicatedLatentWithDummyRanks) { RoundTrip(4, 2, true); }

// One layer of four pages on rank 0 of TP 1, `blocks` filled with room 5's pattern.
struct FilledRoom {
  layout::Contract contract;
  RankLayout rank;
  layout::Manifest m;
  std::vector<uint8_t> arena;
};

FilledRoom FillOneLayer(std::vector<int64_t> blocks) {
  layout::KvShape shape;
  shape.layers = 1;
  shape.pages = 4;
  const layout::Contract contract = layout::BuildKvContract(shape, 1).value();
  FilledRoom room{contract, RankLayout::Create(contract, 1, 0).value(),
                  Room(contract, std::move(blocks), shape.page_tokens),
                  std::vector<uint8_t>(contract.ArenaBytes(), 0)};
  EXPECT_TRUE(room.rank.Fill(room.m, 5, absl::MakeSpan(room.arena)).ok());
  return room;
}

TEST(KvPatternTest, CheckNamesTheFirstWrongByte) {
  FilledRoom room = FillOneLayer({2, 3});
  const layout::Contract& contract = room.contract;
  const RankLayout& rank = room.rank;
  const layout::Manifest& m = room.m;
  std::vector<uint8_t>& arena = room.arena;
  ASSERT_TRUE(rank.Check(m, 5, arena).ok());
  const int64_t page = layout::PageOffset(contract, contract.plan.fields[1], 3).value();
  arena[page + 300] ^= 0xff;
  const absl::Status checked = rank.Check(m, 5, arena);
  ASSERT_EQ(checked.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(checked.message().find("layer.0.v"), std::string::npos) << checked;
  EXPECT_NE(checked.message().find("block 3"), std::string::npos) << checked;
  EXPECT_NE(rank.Digest(m, 5, arena), rank.Digest(m, 5, {}));
}

TEST(KvPatternTest, CheckSampleSeesOnlyItsPositions) {
  FilledRoom room = FillOneLayer({1, 2, 3, 4});
  const layout::Contract& contract = room.contract;
  const RankLayout& rank = room.rank;
  const layout::Manifest& m = room.m;
  std::vector<uint8_t>& arena = room.arena;
  // Position 1 (block 2) is wrong: a sample of positions 0 and 2 passes, one with 1 fails.
  arena[layout::PageOffset(contract, contract.plan.fields[0], 2).value()] ^= 0xff;
  EXPECT_TRUE(rank.CheckSample(m, 5, arena, 2, 0).ok());
  const absl::Status checked = rank.CheckSample(m, 5, arena, 2, 1);
  ASSERT_EQ(checked.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(checked.message().find("block 2"), std::string::npos) << checked;
  EXPECT_EQ(rank.CheckSample(m, 5, arena, 0, 0).code(), absl::StatusCode::kInvalidArgument);
}

// What the soak reports as bytes checked: each rank's share of every page of every field.
TEST(KvPatternTest, BytesCountEachRanksSliceOfEveryPage) {
  layout::KvShape shape;
  shape.layers = 2;
  shape.pages = 12;
  for (const int tp : {1, 2}) {
    const layout::Contract contract = layout::BuildKvContract(shape, tp).value();
    const RankLayout rank = RankLayout::Create(contract, tp, 0).value();
    const layout::Manifest room = Room(contract, {1, 2, 3}, shape.page_tokens);
    const int64_t fields = static_cast<int64_t>(contract.plan.fields.size());
    EXPECT_EQ(rank.Bytes(room), 3 * fields * layout::FieldPageBytes(shape, tp)) << "tp " << tp;
  }
}

TEST(KvPatternTest, ToyDecodeIsDeterministicAndDependsOnTheDigest) {
  EXPECT_EQ(ToyDecode(1, 8), ToyDecode(1, 8));
  EXPECT_NE(ToyDecode(1, 8), ToyDecode(2, 8));
  for (int32_t t : ToyDecode(3, 100)) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 32000);
  }
}

}  // namespace
}  // namespace kvrail::sim
