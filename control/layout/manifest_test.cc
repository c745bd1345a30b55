#include "control/layout/manifest.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::layout {
namespace {

using kvrail::testing::LoadVectors;
using kvrail::testing::VectorInput;

const nlohmann::json& Manifests() {
  static const nlohmann::json* vectors = new nlohmann::json(LoadVectors("manifests.json"));
  return *vectors;
}

const nlohmann::json& Slots() {
  static const nlohmann::json* vectors = new nlohmann::json(LoadVectors("slots.json"));
  return *vectors;
}

const nlohmann::json& ContractsR2() {
  static const nlohmann::json* vectors = new nlohmann::json(LoadVectors("r2/contracts_r2.json"));
  return *vectors;
}

Contract ManifestContract() { return *ParseContract(Manifests()["contract"].get<std::string>()); }

// Every vector: where the reference accepts (and does not recommend rejecting), kvrail parses
// to the same canonical wire and validates the same way; where the reference fails anywhere
// (parse or validation), kvrail fails too, as invalid-manifest.
TEST(ManifestVectorsTest, EveryCaseMatchesTheReferenceOutcome) {
  const Contract contract = ManifestContract();
  for (const auto& entry : Manifests()["vectors"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Manifest> manifest = ParseManifest(VectorInput(entry));
    const bool reference_ok = entry["parse"]["ok"].get<bool>() && entry["validation"].is_object() &&
                              entry["validation"]["ok"].get<bool>();
    const bool strict_reject = entry.value("strict_recommendation", "") == "reject";
    absl::Status outcome =
        manifest.ok() ? ValidateManifest(*manifest, contract) : manifest.status();
    if (reference_ok && !strict_reject) {
      ASSERT_TRUE(outcome.ok()) << outcome;
      EXPECT_EQ(*SerializeManifest(*manifest), entry["parse"]["canonical_wire"].get<std::string>());
    } else {
      ASSERT_FALSE(outcome.ok());
      EXPECT_EQ(CategoryOf(outcome), ErrorCategory::kInvalidManifest) << outcome;
    }
    // Where the reference parsed and kvrail parsed, both canonical forms agree.
    if (manifest.ok() && entry["parse"]["ok"].get<bool>()) {
      EXPECT_EQ(*SerializeManifest(*manifest), entry["parse"]["canonical_wire"].get<std::string>());
    }
  }
}

GroupSpec SpecFromSlotCase(const nlohmann::json& c) {
  GroupSpec spec;
  spec.group_id = "g";
  spec.checkpoint_granularity = c["block_granularity"].get<int64_t>();
  spec.family = "state";
  spec.retention =
      c["retention"] == "sliding_window" ? Retention::kSlidingWindow : Retention::kFullHistory;
  if (!c["sliding_window_tokens"].is_null()) {
    spec.sliding_window_tokens = c["sliding_window_tokens"].get<int64_t>();
  }
  // The reference applies the full_suffix rule only to "full_suffix"; every other value
  // (latest_snapshot, null) takes the single-snapshot slot (§5.2).
  spec.transfer_policy = c["transfer_policy"] == "full_suffix" ? TransferPolicy::kFullSuffix
                                                               : TransferPolicy::kLatestSnapshot;
  return spec;
}

TEST(SlotsVectorsTest, LogicalSlotsMatchTheReference) {
  for (const auto& c : Slots()["logical_slots"]) {
    SCOPED_TRACE(c.dump());
    SlotRange range = LogicalSlots(SpecFromSlotCase(c), c["prefix_len"].get<int64_t>(),
                                   c["prompt_len"].get<int64_t>());
    std::vector<int64_t> slots;
    for (int64_t s = range.begin; s < range.end; ++s) slots.push_back(s);
    EXPECT_EQ(slots, c["logical_slots"].get<std::vector<int64_t>>());
  }
}

TEST(SlotsVectorsTest, BuildManifestMatchesTheReference) {
  const Contract contract = *ParseContract(Slots()["contract"].get<std::string>());
  for (const auto& c : Slots()["build_manifest"]) {
    SCOPED_TRACE(c.dump());
    std::vector<std::vector<int64_t>> tables;
    for (const GroupSpec& spec : contract.group_specs) {
      tables.push_back(Slots()["block_tables"][spec.group_id][c["request_row"].get<size_t>()]
                           .get<std::vector<int64_t>>());
    }
    absl::StatusOr<Manifest> manifest = BuildManifest(
        contract, tables, c["prefix_len"].get<int64_t>(), c["prompt_len"].get<int64_t>());
    if (c["result"]["ok"].get<bool>()) {
      ASSERT_TRUE(manifest.ok()) << manifest.status();
      EXPECT_EQ(*SerializeManifest(*manifest), c["result"]["manifest_wire"].get<std::string>());
      EXPECT_TRUE(ValidateManifest(*manifest, contract).ok());
    } else {
      EXPECT_FALSE(manifest.ok());
      EXPECT_EQ(CategoryOf(manifest.status()), ErrorCategory::kInvalidManifest);
    }
  }
}

// 2026-09: block ids are bounded by the virtual block count (CACHEPD §12.2).
TEST(ManifestR2VectorsTest, BlockBoundsMatchTheReference) {
  int cases = 0;
  for (const auto& entry : ContractsR2()["manifest_bounds"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> contract = ParseContract(entry["layout"].get<std::string>());
    ASSERT_TRUE(contract.ok()) << contract.status();
    absl::StatusOr<Manifest> manifest = ParseManifest(entry["manifest"].get<std::string>());
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    absl::Status status = ValidateManifest(*manifest, *contract);
    if (entry["result"]["ok"].get<bool>()) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      ASSERT_FALSE(status.ok());
      EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidManifest) << status;
    }
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

// One history group of 6 local pages (ids 1..5), sharded over `shards` owners.
Contract ShardedContract(int64_t shards) {
  for (const auto& entry : ContractsR2()["manifest_bounds"]) {
    if (entry["name"] != "sharded_virtual_id_in_range") continue;
    Contract contract = *ParseContract(entry["layout"].get<std::string>());
    contract.group_specs[0].shard_count = shards;
    return contract;
  }
  ADD_FAILURE() << "no sharded_virtual_id_in_range case";
  return Contract();
}

Manifest OneBlock(int64_t id) {
  Manifest manifest;
  manifest.groups = {{"history", {id}}};
  manifest.prefix_len = 0;
  manifest.prompt_len = 1;
  return manifest;
}

TEST(ManifestTest, ShardedGroupIdsAreBoundedByTheVirtualBlockCount) {
  const Contract contract = ShardedContract(4);  // 1 + (6 - 1) * 4 = 21
  EXPECT_TRUE(ValidateManifest(OneBlock(1), contract).ok());
  EXPECT_TRUE(ValidateManifest(OneBlock(20), contract).ok());
  absl::Status status = ValidateManifest(OneBlock(21), contract);
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kInvalidManifest);
  EXPECT_NE(status.message().find("outside 1..20"), absl::string_view::npos) << status;
  EXPECT_FALSE(ValidateManifest(OneBlock(0), contract).ok());
}

TEST(ManifestTest, UnshardedGroupIdsAreBoundedByThePageCount) {
  const Contract contract = ShardedContract(1);
  EXPECT_TRUE(ValidateManifest(OneBlock(5), contract).ok());
  EXPECT_FALSE(ValidateManifest(OneBlock(6), contract).ok());
}

TEST(ManifestTest, BuildManifestTakesVirtualIdsOfAShardedGroup) {
  const std::vector<std::vector<int64_t>> table = {{20}};
  EXPECT_TRUE(BuildManifest(ShardedContract(4), table, 0, 1).ok());
  absl::StatusOr<Manifest> unsharded = BuildManifest(ShardedContract(1), table, 0, 1);
  EXPECT_EQ(CategoryOf(unsharded.status()), ErrorCategory::kInvalidManifest);
}

TEST(ManifestTest, ErrorsNameTheGroupAndBlock) {
  Manifest m = *ParseManifest(
      R"({"groups":[{"group_id":"history","block_ids":[1,2,3,64]},)"
      R"({"group_id":"window","block_ids":[10,11,12]},{"group_id":"state","block_ids":[20]}],)"
      R"("prefix_len":0,"prompt_len":14})");
  absl::Status status = ValidateManifest(m, ManifestContract());
  EXPECT_NE(status.message().find("groups[0].block_ids[3]"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("CACHEPD §5.3"), absl::string_view::npos) << status;
}

TEST(ManifestTest, StrictTypesAreRejectedAtParse) {
  for (const char* wire : {
           R"({"groups":[],"prefix_len":0,"prompt_len":"14"})",
           R"({"groups":[{"group_id":"h","block_ids":[true]}],"prefix_len":0,"prompt_len":4})",
           R"({"groups":[{"group_id":"h","block_ids":[1.0]}],"prefix_len":0,"prompt_len":4})",
           R"({"groups":[{"group_id":"h","block_ids":"12"}],"prefix_len":0,"prompt_len":4})",
           R"({"groups":5,"prefix_len":0,"prompt_len":4})",
           R"({"groups":[],"prefix_len":-4,"prompt_len":4})",
           R"({"groups":[],"prefix_len":0,"prefix_len":0,"prompt_len":4})",
       }) {
    SCOPED_TRACE(wire);
    absl::StatusOr<Manifest> m = ParseManifest(wire);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(CategoryOf(m.status()), ErrorCategory::kInvalidManifest);
  }
}

TEST(ManifestTest, RandomValidManifestsRoundTrip) {
  const Contract contract = ManifestContract();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    int64_t prompt = 1 + static_cast<int64_t>(rng() % 200);
    int64_t prefix = static_cast<int64_t>(rng() % prompt) / 4 * 4;
    std::vector<std::vector<int64_t>> tables(3);
    for (auto& table : tables) {
      for (int s = 0; s < 60; ++s) table.push_back(1 + static_cast<int64_t>(rng() % 63));
    }
    absl::StatusOr<Manifest> m = BuildManifest(contract, tables, prefix, prompt);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(ValidateManifest(*m, contract).ok());
    std::string wire = *SerializeManifest(*m);
    absl::StatusOr<Manifest> back = ParseManifest(wire);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*SerializeManifest(*back), wire);
  }
}

// SerializeManifest writes the canonical bytes directly: they are what the ordered_json DOM of
// the manifest dumps as (CACHEPD §4.2), escapes included.
TEST(ManifestTest, SerializedBytesAreTheDomDump) {
  Manifest manifest;
  manifest.groups = {{"full", {1, 2, 9223372036854775807}},
                     {"gr\xC3\xA9 \"q\" back\\slash/tab\t\x7F", {}},
                     {"\xF0\x9F\x98\x80", {7}}};
  manifest.prefix_len = 16;
  manifest.prompt_len = 4096;
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const ManifestGroup& g : manifest.groups) {
    groups.push_back({{"group_id", g.group_id}, {"block_ids", g.block_ids}});
  }
  const nlohmann::ordered_json root = {{"groups", std::move(groups)},
                                       {"prefix_len", manifest.prefix_len},
                                       {"prompt_len", manifest.prompt_len}};
  EXPECT_EQ(*SerializeManifest(manifest), root.dump(-1, ' ', /*ensure_ascii=*/true));
  manifest.groups[0].group_id = "bad \xC3";  // not UTF-8: refused, as the DOM's dump refuses it
  EXPECT_EQ(CategoryOf(SerializeManifest(manifest).status()), ErrorCategory::kInvalidManifest);
}

}  // namespace
}  // namespace kvrail::layout
