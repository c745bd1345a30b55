#include "control/plan/copy_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/plan/planner.h"
#include "control/plan/vector_cases.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

using kvrail::testing::LoadVectors;

// One descriptors.json case, parsed.
struct DescriptorCase {
  layout::Contract src;
  layout::Contract dst;
  layout::Manifest src_room;
  layout::Manifest dst_room;
  std::vector<Fragment> fragments;
};

DescriptorCase Load(const nlohmann::json& c) {
  return {*layout::ParseContract(c["prefill_contract"].get<std::string>()),
          *layout::ParseContract(c["decode_contract"].get<std::string>()),
          *layout::ParseManifest(c["src_manifest"].get<std::string>()),
          *layout::ParseManifest(c["dst_manifest"].get<std::string>()),
          testing::FragmentsFromJson(c["fragments"])};
}

// Every non-layerwise case of descriptors.json: the exact (src, dst, length) triples, in
// the reference's order, once the arena bases are added.
TEST(CopyPlanVectorsTest, DescriptorsMatchTheReferenceExactly) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  int checked = 0;
  for (const auto& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    if (c.contains("layerwise") && !c["layerwise"].is_null()) continue;
    const DescriptorCase d = Load(c);
    const layout::Contract& src = d.src;
    const layout::Contract& dst = d.dst;
    const layout::Manifest& src_m = d.src_room;
    const layout::Manifest& dst_m = d.dst_room;
    absl::StatusOr<CopyPlan> plan = CopyPlan::Bind(src, dst, d.fragments);
    ASSERT_TRUE(plan.ok()) << plan.status();
    CopyList copies;
    ASSERT_TRUE(plan->Expand(src_m, dst_m, copies).ok());
    const uint64_t src_base = c["src_kv_ptr"];
    const uint64_t dst_base = c["dst_kv_ptr"];
    ASSERT_EQ(copies.size(), c["descriptors"].size());
    EXPECT_EQ(static_cast<int64_t>(copies.size()), plan->CountCopies(src_m));
    uint64_t total = 0;
    for (size_t i = 0; i < copies.size(); ++i) {
      const auto& d = c["descriptors"][i];
      EXPECT_EQ(src_base + copies[i].src_offset, d[0].get<uint64_t>()) << i;
      EXPECT_EQ(dst_base + copies[i].dst_offset, d[1].get<uint64_t>()) << i;
      EXPECT_EQ(copies[i].length, d[2].get<uint64_t>()) << i;
      total += copies[i].length;
    }
    EXPECT_EQ(total, c["total_bytes"].get<uint64_t>());
    ++checked;
  }
  EXPECT_GE(checked, 11);
}

// Applies `copies` from `src` into `dst`.
template <typename Copies>
void Apply(const Copies& copies, const std::string& src, std::string& dst) {
  for (const Copy& c : copies) {
    ASSERT_LE(c.src_offset + c.length, src.size());
    ASSERT_LE(c.dst_offset + c.length, dst.size());
    std::memcpy(&dst[c.dst_offset], &src[c.src_offset], c.length);
  }
}

// Coalescing is exact: the coalesced list writes the same bytes as the original list.
TEST(CoalesceTest, CoalescedCopiesWriteExactlyTheSameBytes) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Copy> copies;
    uint64_t s = 0, d = 0;
    const int n = 1 + static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      uint64_t len = 1 + rng() % 64;
      // Mostly adjacent on both sides; sometimes a gap on one side or both.
      switch (rng() % 4) {
        case 0:
          s += rng() % 16;
          break;
        case 1:
          d += rng() % 16;
          break;
        default:
          break;
      }
      copies.push_back({s, d, len});
      s += len;
      d += len;
    }
    std::string src(s + 64, '\0');
    for (char& b : src) b = static_cast<char>(rng());
    std::string want(d + 64, '\x5a'), got(d + 64, '\x5a');
    Apply(copies, src, want);
    std::vector<Copy> merged = copies;
    size_t left = Coalesce(merged);
    EXPECT_EQ(left, merged.size());
    EXPECT_LE(merged.size(), copies.size());
    Apply(merged, src, got);
    ASSERT_EQ(got, want);
    // Maximal: no two neighbours remain adjacent on both sides.
    for (size_t i = 1; i < merged.size(); ++i) {
      EXPECT_FALSE(merged[i - 1].src_offset + merged[i - 1].length == merged[i].src_offset &&
                   merged[i - 1].dst_offset + merged[i - 1].length == merged[i].dst_offset);
    }
  }
}

TEST(CoalesceTest, ConsecutiveWholePagesBecomeOneCopy) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  const auto& c = vectors["cases"][0];  // equal_tp_whole_field
  layout::Contract src = *layout::ParseContract(c["prefill_contract"].get<std::string>());
  const layout::Contract& dst = src;  // same geometry on both sides: pages line up
  layout::Manifest m = *layout::ParseManifest(c["src_manifest"].get<std::string>());
  CopyPlan plan = *CopyPlan::Bind(src, dst, {});
  CopyList copies;
  ASSERT_TRUE(plan.Expand(m, m, copies).ok());
  const size_t before = copies.size();
  Coalesce(copies);
  EXPECT_LT(copies.size(), before);
}

// A run ends where it would grow past kMostMergedBytes: ten MiB back to back are copies of 4, 4
// and 2 MiB, and a copy already longer than that stays alone, the next one starting a run.
TEST(CoalesceTest, ARunEndsAtTheMostMergedBytes) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  std::vector<Copy> copies;
  for (uint64_t i = 0; i < 10; ++i) copies.push_back({i * kMiB, 64 * kMiB + i * kMiB, kMiB});
  copies.push_back({10 * kMiB, 74 * kMiB, 5 * kMiB});
  copies.push_back({15 * kMiB, 79 * kMiB, kMiB});
  Coalesce(copies);
  std::vector<uint64_t> lengths;
  for (const Copy& c : copies) lengths.push_back(c.length / kMiB);
  EXPECT_EQ(lengths, (std::vector<uint64_t>{4, 4, 2, 5, 1}));
  ASSERT_EQ(kMostMergedBytes, 4 * kMiB);
}

// The hot-path variant coalesces as it emits and must equal Expand followed by Coalesce.
TEST(CopyPlanTest, ExpandCoalescedEqualsExpandThenCoalesce) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  for (const auto& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const DescriptorCase d = Load(c);
    // The case as given, and the prefill copying whole fields into its own geometry, where
    // consecutive pages line up and runs do merge.
    const CopyPlan given = *CopyPlan::Bind(d.src, d.dst, d.fragments);
    const CopyPlan same = *CopyPlan::Bind(d.src, d.src, {});
    const std::pair<const CopyPlan*, const layout::Manifest*> runs[] = {{&given, &d.dst_room},
                                                                        {&same, &d.src_room}};
    for (const auto& [plan, dst_room] : runs) {
      CopyList slow = {{7, 7, 7}}, fast = {{7, 7, 7}};
      ASSERT_TRUE(plan->Expand(d.src_room, *dst_room, slow).ok());
      ASSERT_TRUE(plan->ExpandCoalesced(d.src_room, *dst_room, fast).ok());
      std::vector<Copy> tail(slow.begin() + 1, slow.end());
      Coalesce(tail);
      ASSERT_EQ(fast.size(), tail.size() + 1);
      EXPECT_EQ(fast[0], (Copy{7, 7, 7}));  // earlier content is never merged into
      for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(fast[i + 1], tail[i]) << i;
    }
  }
}

// The sender's cursor yields, batch by batch, exactly the list Expand (or ExpandCoalesced)
// would build, whatever the batch size.
TEST(CopyCursorTest, BatchesConcatenateToTheExpandedList) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  for (const auto& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    if (c.contains("layerwise") && !c["layerwise"].is_null()) continue;
    const DescriptorCase d = Load(c);
    const layout::Contract& src = d.src;
    const layout::Contract& dst = d.dst;
    const layout::Manifest& src_m = d.src_room;
    const layout::Manifest& dst_m = d.dst_room;
    CopyPlan plan = *CopyPlan::Bind(src, dst, d.fragments);
    for (bool coalesce : {false, true}) {
      CopyList want;
      ASSERT_TRUE(
          (coalesce ? plan.ExpandCoalesced(src_m, dst_m, want) : plan.Expand(src_m, dst_m, want))
              .ok());
      for (size_t batch : {1, 2, 3, 7, 4096}) {
        absl::StatusOr<CopyCursor> cursor = plan.Begin(src_m, dst_m, coalesce);
        ASSERT_TRUE(cursor.ok());
        CopyList got;
        std::vector<Copy> buffer(batch);
        for (size_t n; (n = cursor->Next(buffer.data(), batch)) > 0;) {
          ASSERT_LE(n, batch);
          for (size_t i = 0; i < n; ++i) got.push_back(buffer[i]);
        }
        EXPECT_TRUE(cursor->done());
        EXPECT_TRUE(got == want) << "batch " << batch << " coalesce " << coalesce;
      }
    }
  }
}

// Prefill rank 0's strided, coalesced copies of a room of `blocks` (the same block ids on both
// sides) at TP prefill:decode, 2 layers of 4 heads of 32 bf16, 16-token pages: its rows, one per
// copy, must be the per-row list's.
std::vector<Copy> StridedRoom(int prefill_tp, int decode_tp, const std::vector<int64_t>& blocks,
                              int64_t head_dim = 32, int64_t pages = 16) {
  layout::KvShape shape;
  shape.layers = 2;
  shape.kv_heads = 4;
  shape.head_dim = head_dim;
  shape.pages = pages;
  const layout::Contract src = layout::BuildKvContract(shape, prefill_tp).value();
  const layout::Contract dst = layout::BuildKvContract(shape, decode_tp).value();
  const Planner planner = Planner::Create(prefill_tp, decode_tp, src, dst).value();
  const RegistrationOutcome outcome = planner.OnRegistration(0, 0);
  const CopyPlan plan = CopyPlan::Bind(src, dst, outcome.fragments, outcome.owner_filters).value();
  const int64_t tokens = static_cast<int64_t>(blocks.size()) * shape.page_tokens;
  const layout::Manifest s = layout::BuildManifest(src, {blocks}, 0, tokens).value();
  const layout::Manifest d = layout::BuildManifest(dst, {blocks}, 0, tokens).value();
  CopyList per_row;
  EXPECT_TRUE(plan.Expand(s, d, per_row).ok());
  absl::StatusOr<CopyCursor> cursor = plan.Begin(s, d, /*coalesce=*/true, /*strided=*/true);
  EXPECT_TRUE(cursor.ok()) << cursor.status();
  std::vector<Copy> got;
  Copy batch[3];  // small, so that runs cross batch ends
  for (size_t n; cursor.ok() && (n = cursor->Next(batch, 3)) > 0;) {
    got.insert(got.end(), batch, batch + n);
  }
  CopyList rows;
  for (const Copy& c : got) {
    ForEachRow(c, [&](uint64_t so, uint64_t dof, uint64_t n) { rows.push_back({so, dof, n}); });
  }
  EXPECT_TRUE(rows == per_row) << "the strided copies' rows are not the per-row list";
  return got;
}

// Head-sliced pages that follow each other on both sides are one strided copy per field (k and
// v of each layer): a TP-2 prefill's rows landing apart in a TP-1 decode, and a TP-1 prefill's
// rows read apart for a TP-2 decode. A block that breaks the run starts a new copy.
TEST(CopyCursorTest, StridedPagesBackToBackMergeIntoOneCopyPerField) {
  for (const auto& [p, d] : {std::pair{2, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE(absl::StrCat(p, ":", d));
    const std::vector<Copy> run = StridedRoom(p, d, {1, 2, 3, 4, 5});
    ASSERT_EQ(run.size(), 4u);  // 2 layers x k, v
    for (const Copy& c : run) EXPECT_EQ(c.rows, 5u * 16u) << c.src_offset;
    const std::vector<Copy> broken = StridedRoom(p, d, {1, 2, 3, 7, 8});
    ASSERT_EQ(broken.size(), 8u);  // each field: pages 1-3, then 7-8
    EXPECT_EQ(broken[0].rows, 3u * 16u);
    EXPECT_EQ(broken[1].rows, 2u * 16u);
  }
}

// A strided run ends where its rows would pass kMostMergedBytes: heads of 8,192 bf16, so that a
// TP-2 prefill's slice of a page is 16 rows of 32 KiB (512 KiB) and 20 pages back to back are
// runs of 8, 8 and 4 pages per field; still the per-row list's rows.
TEST(CopyCursorTest, StridedRunsEndAtTheMostMergedBytes) {
  std::vector<int64_t> blocks;
  for (int64_t b = 1; b <= 20; ++b) blocks.push_back(b);
  const std::vector<Copy> runs = StridedRoom(2, 1, blocks, 8192, 24);
  ASSERT_EQ(runs.size(), 12u);  // 2 layers x k, v x 3 runs
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].rows, (i % 3 == 2 ? 4u : 8u) * 16u) << "copy " << i;
    EXPECT_LE(runs[i].rows * runs[i].length, kMostMergedBytes);
  }
}

bool ByOffsets(const Copy& a, const Copy& b) {
  return std::tie(a.src_offset, a.dst_offset, a.length) <
         std::tie(b.src_offset, b.dst_offset, b.length);
}

// Layer-wise streaming: the room's copies cut at any layer boundary are exactly the room's
// copies, each part only of its layers; a contract with a field that is not layer.<N>.* has
// no layers to stream.
TEST(CopyPlanTest, LayerRangesPartitionTheRoom) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  int layered = 0;
  for (const auto& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const DescriptorCase d = Load(c);
    const CopyPlan plan = *CopyPlan::Bind(d.src, d.dst, d.fragments);
    if (!plan.layered().ok()) {
      CopyList none;
      EXPECT_EQ(plan.ExpandLayers(d.src_room, d.dst_room, {0, 1}, true, none).code(),
                absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(none.empty());
      continue;
    }
    ++layered;
    int64_t top = 0;
    for (size_t f = 0; f < plan.fragments().size(); ++f) {
      top = std::max(top, plan.fragment_layer(f) + 1);
    }
    CopyList all;
    ASSERT_TRUE(plan.Expand(d.src_room, d.dst_room, all).ok());
    std::vector<Copy> want(all.begin(), all.end());
    std::sort(want.begin(), want.end(), ByOffsets);
    for (int64_t cut : {int64_t{0}, int64_t{1}, top / 2, top}) {
      CopyList parts;
      ASSERT_TRUE(plan.ExpandLayers(d.src_room, d.dst_room, {0, cut}, false, parts).ok());
      ASSERT_TRUE(plan.ExpandLayers(d.src_room, d.dst_room, {cut, INT64_MAX}, false, parts).ok());
      std::vector<Copy> got(parts.begin(), parts.end());
      std::sort(got.begin(), got.end(), ByOffsets);
      EXPECT_TRUE(got == want) << "cut at layer " << cut;
    }
    // One layer at a time, coalesced: the same bytes land as from the whole room.
    uint64_t src_size = 0, dst_size = 0;  // the vectors' arenas are not all ArenaBytes() long
    for (const Copy& copy : want) {
      src_size = std::max(src_size, copy.src_offset + copy.length);
      dst_size = std::max(dst_size, copy.dst_offset + copy.length);
    }
    std::string source(src_size, '\0');
    for (uint64_t i = 0; i < src_size; ++i) source[i] = static_cast<char>(i * 131 + 7);
    std::string whole(dst_size, '\x5a'), layer_by_layer = whole;
    CopyList merged;
    ASSERT_TRUE(plan.ExpandCoalesced(d.src_room, d.dst_room, merged).ok());
    Apply(merged, source, whole);
    for (int64_t layer = 0; layer < top; ++layer) {
      CopyList one;
      ASSERT_TRUE(plan.ExpandLayers(d.src_room, d.dst_room, {layer, layer + 1}, true, one).ok());
      Apply(one, source, layer_by_layer);
    }
    EXPECT_TRUE(whole == layer_by_layer);
  }
  EXPECT_GE(layered, 1);
}

TEST(CopyPlanTest, BadRoomsAppendNothing) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  const auto& c = vectors["cases"][0];
  const DescriptorCase d = Load(c);
  const layout::Contract& src = d.src;
  const layout::Contract& dst = d.dst;
  const layout::Manifest& src_m = d.src_room;
  const layout::Manifest& dst_m = d.dst_room;
  CopyPlan plan = *CopyPlan::Bind(src, dst, {});
  CopyList copies = {{1, 2, 3}};
  layout::Manifest short_dst = dst_m;
  short_dst.groups[0].block_ids.pop_back();
  absl::Status status = plan.Expand(src_m, short_dst, copies);
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidManifest);
  layout::Manifest out_of_range = dst_m;
  out_of_range.groups[0].block_ids[0] = 1000000;
  EXPECT_FALSE(plan.Expand(src_m, out_of_range, copies).ok());
  EXPECT_EQ(copies.size(), 1u);
}

TEST(CopyPlanTest, FragmentsPastThePagePayloadAreRefused) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  const auto& c = vectors["cases"][1];
  const DescriptorCase d = Load(c);
  std::vector<Fragment> fragments = d.fragments;
  const layout::Contract& src = d.src;
  const layout::Contract& dst = d.dst;
  ASSERT_FALSE(fragments.empty());
  fragments[0].bytes_per_row += 1 << 20;
  absl::StatusOr<CopyPlan> plan = CopyPlan::Bind(src, dst, fragments);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(CategoryOf(plan.status()), ErrorCategory::kUnsupportedLayout);
}

}  // namespace
}  // namespace kvrail::plan
