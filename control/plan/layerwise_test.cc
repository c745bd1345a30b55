#include "control/plan/layerwise.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/vector_cases.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

using kvrail::testing::LoadVectors;

std::vector<std::vector<int64_t>> Tables(const layout::Contract& contract,
                                         const nlohmann::json& tables, size_t row) {
  std::vector<std::vector<int64_t>> out;
  for (const layout::GroupSpec& spec : contract.group_specs) {
    out.push_back(tables[spec.group_id][row].get<std::vector<int64_t>>());
  }
  return out;
}

TEST(LayerwiseVectorsTest, ChunkSelectionsMatchTheReference) {
  const nlohmann::json slots = LoadVectors("slots.json");
  const layout::Contract contract = *layout::ParseContract(slots["contract"].get<std::string>());
  for (const auto& c : slots["layerwise_selection"]) {
    SCOPED_TRACE(c.dump());
    absl::StatusOr<std::vector<GroupSelection>> selection =
        SelectChunkBlocks(contract, Tables(contract, slots["block_tables"], c["request_row"]),
                          c["prefix_len"], c["prompt_len"], c["chunk_start"], c["chunk_end"]);
    if (!c["result"]["ok"].get<bool>()) {
      ASSERT_FALSE(selection.ok());
      EXPECT_EQ(CategoryOf(selection.status()), ErrorCategory::kInvalidManifest);
      continue;
    }
    ASSERT_TRUE(selection.ok()) << selection.status();
    const auto& want = c["result"]["groups"];
    ASSERT_EQ(selection->size(), want.size());
    for (size_t g = 0; g < want.size(); ++g) {
      EXPECT_EQ((*selection)[g].group_id, want[g]["group_id"].get<std::string>());
      EXPECT_EQ((*selection)[g].source_block_ids,
                want[g]["source_block_ids"].get<std::vector<int64_t>>());
      EXPECT_EQ((*selection)[g].destination_positions,
                want[g]["destination_positions"].get<std::vector<int64_t>>());
    }
  }
}

TEST(LayerwiseVectorsTest, StepCounterIsWrapSafe) {
  const nlohmann::json slots = LoadVectors("slots.json");
  ASSERT_EQ(slots["step_counter"]["COUNT_NUM_MAX"].get<uint64_t>(), uint64_t{1} << 62);
  for (const auto& c : slots["step_counter"]["cases"]) {
    EXPECT_EQ(IsStepReady(c["ready_step"], c["target_step"]), c["is_step_ready"].get<bool>())
        << c.dump();
  }
}

TEST(LayerwiseVectorsTest, ProducerScheduleMatchesTheReference) {
  const nlohmann::json example = LoadVectors("slots.json")["producer_schedule_example"];
  absl::StatusOr<std::vector<std::vector<std::string>>> steps = FieldsByProducerStep(
      example["field_ids"].get<std::vector<std::string>>(), example["num_target_layers"]);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, example["fields_by_step"].get<std::vector<std::vector<std::string>>>());
  EXPECT_FALSE(FieldsByProducerStep({"latent"}, 2).ok());
  EXPECT_FALSE(FieldsByProducerStep({"layer.x.k"}, 2).ok());
  EXPECT_FALSE(FieldsByProducerStep({"layer.1"}, 2).ok());
}

// descriptors.json's layerwise case: one chunk of selected producer steps resolves to the
// reference's triples (compared after coalescing, which ExpandChunk does as it goes).
TEST(LayerwiseVectorsTest, ChunkDescriptorsMatchTheReference) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  int checked = 0;
  for (const auto& c : vectors["cases"]) {
    if (!c.contains("layerwise") || c["layerwise"].is_null()) continue;
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto& lw = c["layerwise"];
    layout::Contract src = *layout::ParseContract(c["prefill_contract"].get<std::string>());
    layout::Contract dst = *layout::ParseContract(c["decode_contract"].get<std::string>());
    layout::Manifest src_m = *layout::ParseManifest(c["src_manifest"].get<std::string>());
    layout::Manifest dst_m = *layout::ParseManifest(c["dst_manifest"].get<std::string>());
    absl::StatusOr<std::vector<GroupSelection>> selection =
        SelectChunkBlocks(src, Tables(src, lw["block_tables"], lw["request_row"]), src_m.prefix_len,
                          src_m.prompt_len, lw["chunk_start"], lw["chunk_end"]);
    ASSERT_TRUE(selection.ok()) << selection.status();
    for (size_t g = 0; g < selection->size(); ++g) {
      EXPECT_EQ((*selection)[g].source_block_ids,
                lw["selection"][g]["source_block_ids"].get<std::vector<int64_t>>());
      EXPECT_EQ((*selection)[g].destination_positions,
                lw["selection"][g]["destination_positions"].get<std::vector<int64_t>>());
    }
    std::vector<Fragment> fragments;
    for (const auto& f : c["fragments"]) {
      fragments.push_back({f["group_id"], f["field_id"], f["src_byte_offset"], f["dst_byte_offset"],
                           f["src_row_stride_bytes"], f["dst_row_stride_bytes"], f["bytes_per_row"],
                           f["rows_per_page"]});
    }
    CopyPlan plan = *CopyPlan::Bind(src, dst, fragments);
    CopyList got;
    ASSERT_TRUE(
        plan.ExpandChunk(*selection, lw["field_ids"].get<std::vector<std::string>>(), dst_m, got)
            .ok());
    std::vector<Copy> want;
    const uint64_t src_base = c["src_kv_ptr"], dst_base = c["dst_kv_ptr"];
    for (const auto& d : c["descriptors"]) {
      want.push_back(
          {d[0].get<uint64_t>() - src_base, d[1].get<uint64_t>() - dst_base, d[2].get<uint64_t>()});
    }
    Coalesce(want);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
    ++checked;
  }
  EXPECT_EQ(checked, 1);
}

}  // namespace
}  // namespace kvrail::plan
