// Contracts of revision 2026-09 beside the snapshot's (CACHEPD §12.1, §12.2): which form a wire
// is in, the checks of each form, writing either form, and the r2 reference vectors.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "control/layout/contract.h"
#include "control/layout/revision.h"
#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::layout {
namespace {

using kvrail::testing::LoadVectors;
using kvrail::testing::VectorInput;
using nlohmann::ordered_json;

const nlohmann::json& ContractsR2() {
  static const nlohmann::json* vectors = new nlohmann::json(LoadVectors("r2/contracts_r2.json"));
  return *vectors;
}

const nlohmann::json& SnapshotContracts() {
  static const nlohmann::json* vectors = new nlohmann::json(LoadVectors("contracts.json"));
  return *vectors;
}

const nlohmann::json& R2Case(absl::string_view kind, absl::string_view name) {
  for (const auto& entry : ContractsR2()[std::string(kind)]) {
    if (entry["name"].get<std::string>() == name) return entry;
  }
  ADD_FAILURE() << "no r2 case " << kind << "/" << name;
  static const nlohmann::json* none = new nlohmann::json();
  return *none;
}

// The canonical 2026-09 wire of one history group (page_count 6, lcm_block_bytes 32).
std::string OneGroupWire() {
  return R2Case("valid", "shard_count_omitted")["canonical_wire"].get<std::string>();
}

// The canonical 2026-09 wire of one checkpointed state group.
std::string StateGroupWire() {
  return R2Case("valid", "state_checkpoint_group")["canonical_wire"].get<std::string>();
}

// `wire` parsed, changed by `edit` and written back compact (member order kept).
std::string Edited(const std::string& wire, const std::function<void(ordered_json&)>& edit) {
  ordered_json root = ordered_json::parse(wire);
  edit(root);
  return root.dump();
}

// `wire` with every group spec's 2026-09 members and plan.resident_block_bytes removed.
std::string InSnapshotForm(const std::string& wire) {
  return Edited(wire, [](ordered_json& root) {
    root["plan"].erase("resident_block_bytes");
    for (auto& spec : root["group_specs"]) {
      spec.erase("replayable");
      spec.erase("shard_count");
    }
  });
}

void ExpectRefused(const std::string& wire, absl::string_view names) {
  absl::StatusOr<Contract> contract = ParseContract(wire);
  ASSERT_FALSE(contract.ok()) << wire;
  EXPECT_EQ(CategoryOf(contract.status()), ErrorCategory::kInvalidContract) << contract.status();
  EXPECT_NE(contract.status().message().find(names), absl::string_view::npos) << contract.status();
}

// --- The r2 reference vectors ----------------------------------------------------------------

TEST(ContractR2VectorsTest, ValidCasesParseAs2026_09AndWriteTheCanonicalWire) {
  for (const auto& entry : ContractsR2()["valid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> contract = ParseContract(entry["wire"].get<std::string>());
    ASSERT_TRUE(contract.ok()) << contract.status();
    EXPECT_EQ(contract->revision, Revision::k2026_09);
    const std::string canonical = entry["canonical_wire"].get<std::string>();
    EXPECT_EQ(*SerializeContract(*contract), canonical);
    absl::StatusOr<Contract> again = ParseContract(canonical);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*SerializeContract(*again), canonical);
  }
}

TEST(ContractR2VectorsTest, ValidCasesHaveTheReferenceArenaBytes) {
  for (const auto& entry : ContractsR2()["valid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    Contract contract = *ParseContract(entry["wire"].get<std::string>());
    EXPECT_EQ(contract.ArenaBytes(), entry["arena_bytes"].get<int64_t>());
  }
}

TEST(ContractR2VectorsTest, ValidCasesHaveTheReferenceVirtualBlockCounts) {
  for (const auto& entry : ContractsR2()["valid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    Contract contract = *ParseContract(entry["wire"].get<std::string>());
    ASSERT_EQ(entry["virtual_block_counts"].size(), contract.plan.groups.size());
    for (const auto& [group, count] : entry["virtual_block_counts"].items()) {
      EXPECT_EQ(contract.VirtualBlockCount(group), count.get<int64_t>()) << group;
    }
  }
}

TEST(ContractR2VectorsTest, InvalidCasesAreRejectedAsInvalidContract) {
  int cases = 0;
  for (const auto& entry : ContractsR2()["invalid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> contract = ParseContract(entry["wire"].get<std::string>());
    ASSERT_FALSE(contract.ok());
    EXPECT_EQ(CategoryOf(contract.status()), ErrorCategory::kInvalidContract) << contract.status();
    EXPECT_NE(contract.status().message().find("CACHEPD"), absl::string_view::npos)
        << "errors cite the spec section: " << contract.status();
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

TEST(ContractR2VectorsTest, PeerCheckCasesMatchTheReference) {
  int cases = 0;
  for (const auto& entry : ContractsR2()["peer_check"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> prefill = ParseContract(entry["prefill"].get<std::string>());
    absl::StatusOr<Contract> decode = ParseContract(entry["decode"].get<std::string>());
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    ASSERT_TRUE(decode.ok()) << decode.status();
    absl::Status status = CheckPeerContracts(*prefill, *decode);
    if (entry["result"]["ok"].get<bool>()) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      ASSERT_FALSE(status.ok());
      EXPECT_EQ(CategoryOf(status), ErrorCategory::kIncompatiblePeer) << status;
    }
    ++cases;
  }
  EXPECT_GT(cases, 0);
}

// --- Which form a wire is in ----------------------------------------------------------------

TEST(ContractFormTest, SnapshotVectorsParseAsTheSnapshotForm) {
  for (const auto& entry : SnapshotContracts()["valid"]) {
    if (entry.value("strict_recommendation", "accept") == "reject") continue;
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> contract = ParseContract(VectorInput(entry));
    ASSERT_TRUE(contract.ok()) << contract.status();
    EXPECT_EQ(contract->revision, Revision::kSnapshot);
    EXPECT_EQ(*SerializeContract(*contract), entry["result"]["canonical_wire"].get<std::string>());
  }
}

TEST(ContractFormTest, SnapshotContractsWrittenAs2026_09ParseBackEqual) {
  int written = 0;
  for (const auto& entry : SnapshotContracts()["valid"]) {
    if (entry.value("strict_recommendation", "accept") == "reject") continue;
    SCOPED_TRACE(entry["name"].get<std::string>());
    const Contract snapshot = *ParseContract(VectorInput(entry));
    absl::StatusOr<std::string> revised = SerializeContract(snapshot, Revision::k2026_09);
    if (!revised.ok()) {
      // Only a spec that §12.1 refuses (and the snapshot allowed) cannot be written.
      EXPECT_NE(revised.status().message().find("CACHEPD §12.1"), absl::string_view::npos)
          << revised.status();
      continue;
    }
    absl::StatusOr<Contract> back = ParseContract(*revised);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->revision, Revision::k2026_09);
    EXPECT_EQ(*SerializeContract(*back), *revised);
    EXPECT_EQ(*SerializeContract(*back, Revision::kSnapshot), *SerializeContract(snapshot));
    EXPECT_TRUE(CheckPeerContracts(snapshot, *back).ok());
    ++written;
  }
  EXPECT_GT(written, 0);
}

TEST(ContractFormTest, AGroupSpecWithReplayableMakesTheWire2026_09) {
  Contract contract = *ParseContract(OneGroupWire());
  EXPECT_EQ(contract.revision, Revision::k2026_09);
  EXPECT_EQ(ParseContract(InSnapshotForm(OneGroupWire()))->revision, Revision::kSnapshot);
}

TEST(ContractFormTest, In2026_09FormEveryGroupSpecMustCarryReplayable) {
  const std::string two_groups =
      R2Case("valid", "gqa_tp2_full_form")["canonical_wire"].get<std::string>();
  ExpectRefused(Edited(two_groups,
                       [](ordered_json& root) {
                         root["group_specs"][1].erase("replayable");
                         root["group_specs"][1].erase("shard_count");
                       }),
                "group_specs[1].replayable");
}

TEST(ContractFormTest, ShardCountWithoutReplayableIsRefused) {
  ExpectRefused(Edited(OneGroupWire(),
                       [](ordered_json& root) { root["group_specs"][0].erase("replayable"); }),
                "group_specs[0].replayable");
}

TEST(ContractFormTest, ResidentBlockBytesWithSnapshotSpecsIsReadButKeepsTheSnapshotForm) {
  const std::string wire = Edited(InSnapshotForm(OneGroupWire()), [](ordered_json& root) {
    root["plan"]["resident_block_bytes"] = 16;
  });
  absl::StatusOr<Contract> contract = ParseContract(wire);
  ASSERT_TRUE(contract.ok()) << contract.status();
  EXPECT_EQ(contract->revision, Revision::kSnapshot);
  EXPECT_EQ(contract->plan.resident_block_bytes, 16);
  EXPECT_EQ(contract->ArenaBytes(), 6 * 16);
}

TEST(ContractFormTest, WithoutGroupSpecsResidentBlockBytesDecidesTheForm) {
  const std::string empty =
      R"({"plan":{"prefix_granularity":2,"lcm_block_bytes":0,"num_lcm_blocks":0,"groups":[],)"
      R"("planes":[],"fields":[]},"group_specs":[],"transfer_schema":{"fields":[]}})";
  EXPECT_EQ(ParseContract(empty)->revision, Revision::kSnapshot);
  const std::string with_null =
      Edited(empty, [](ordered_json& root) { root["plan"]["resident_block_bytes"] = nullptr; });
  EXPECT_EQ(ParseContract(with_null)->revision, Revision::k2026_09);
  EXPECT_EQ(*SerializeContract(*ParseContract(with_null)), with_null);
}

TEST(ContractFormTest, UnknownGroupSpecMembersAreStillRefused) {
  ExpectRefused(
      Edited(OneGroupWire(), [](ordered_json& root) { root["group_specs"][0]["shard_owner"] = 0; }),
      "group_specs[0].shard_owner");
}

TEST(ContractFormTest, HandBuiltContractsAreWrittenInTheNewestForm) {
  Contract contract = *ParseContract(OneGroupWire());
  Contract hand_built;
  hand_built.plan = contract.plan;
  hand_built.group_specs = contract.group_specs;
  ASSERT_TRUE(ValidateContract(hand_built).ok());
  EXPECT_EQ(hand_built.revision, kNewestRevision);
  EXPECT_EQ(*SerializeContract(hand_built), OneGroupWire());
}

// --- The 2026-09 members and checks ----------------------------------------------------------

TEST(ContractR2RulesTest, ReplayableMustBeAJsonBool) {
  for (const ordered_json& value : {ordered_json(nullptr), ordered_json(0), ordered_json("true")}) {
    SCOPED_TRACE(value.dump());
    ExpectRefused(Edited(OneGroupWire(),
                         [&](ordered_json& root) { root["group_specs"][0]["replayable"] = value; }),
                  "group_specs[0].replayable");
  }
}

TEST(ContractR2RulesTest, ShardCountMustBeAPositiveInteger) {
  for (const ordered_json& value : {ordered_json(0), ordered_json(-2), ordered_json(true),
                                    ordered_json(nullptr), ordered_json(2.0), ordered_json("2")}) {
    SCOPED_TRACE(value.dump());
    ExpectRefused(
        Edited(OneGroupWire(),
               [&](ordered_json& root) { root["group_specs"][0]["shard_count"] = value; }),
        "shard_count");
  }
}

TEST(ContractR2RulesTest, ShardCountDefaultsToOne) {
  const std::string wire = Edited(
      OneGroupWire(), [](ordered_json& root) { root["group_specs"][0].erase("shard_count"); });
  EXPECT_EQ(ParseContract(wire)->group_specs[0].shard_count, 1);
}

TEST(ContractR2RulesTest, CheckpointGeometryRequiresFullHistoryRetentionIn2026_09) {
  auto sliding = [](ordered_json& root) {
    root["group_specs"][0]["retention"] = "sliding_window";
    root["group_specs"][0]["sliding_window_tokens"] = 8;
  };
  ExpectRefused(Edited(StateGroupWire(), sliding), "group_specs[0].retention");
  // The snapshot has no such rule, and its form keeps its rules.
  absl::StatusOr<Contract> snapshot =
      ParseContract(InSnapshotForm(Edited(StateGroupWire(), sliding)));
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->revision, Revision::kSnapshot);
}

TEST(ContractR2RulesTest, StateFamilyRequiresCheckpointGeometryIn2026_09) {
  auto state_rows = [](ordered_json& root) { root["group_specs"][0]["family"] = "state"; };
  ExpectRefused(Edited(OneGroupWire(), state_rows), "group_specs[0].family");
  absl::StatusOr<Contract> snapshot =
      ParseContract(InSnapshotForm(Edited(OneGroupWire(), state_rows)));
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->revision, Revision::kSnapshot);
}

TEST(ContractR2RulesTest, ReplayableRequiresSlidingWindowRetention) {
  ExpectRefused(Edited(OneGroupWire(),
                       [](ordered_json& root) { root["group_specs"][0]["replayable"] = true; }),
                "group_specs[0].replayable");
  absl::StatusOr<Contract> sliding = ParseContract(Edited(OneGroupWire(), [](ordered_json& root) {
    root["group_specs"][0]["replayable"] = true;
    root["group_specs"][0]["retention"] = "sliding_window";
    root["group_specs"][0]["sliding_window_tokens"] = 8;
  }));
  ASSERT_TRUE(sliding.ok()) << sliding.status();
  EXPECT_TRUE(sliding->group_specs[0].replayable);
}

TEST(ContractR2RulesTest, ResidentBlockBytesIsBetweenZeroAndLcmBlockBytes) {
  auto with = [](int64_t bytes) {
    return Edited(OneGroupWire(),
                  [&](ordered_json& root) { root["plan"]["resident_block_bytes"] = bytes; });
  };
  EXPECT_TRUE(ParseContract(with(0)).ok());
  EXPECT_TRUE(ParseContract(with(32)).ok());  // lcm_block_bytes
  ExpectRefused(with(33), "plan.resident_block_bytes");
  ExpectRefused(with(-1), "plan.resident_block_bytes");
  ExpectRefused(Edited(OneGroupWire(),
                       [](ordered_json& root) { root["plan"]["resident_block_bytes"] = 16.0; }),
                "plan.resident_block_bytes");
}

TEST(ContractR2RulesTest, ArenaBytesUsesResidentBlockBytesWhenSet) {
  Contract contract = *ParseContract(OneGroupWire());
  EXPECT_EQ(contract.ArenaBytes(), (5 + 1) * 32);
  contract.plan.resident_block_bytes = 8;
  EXPECT_EQ(contract.ArenaBytes(), (5 + 1) * 8);
}

TEST(ContractR2RulesTest, VirtualBlockCountCountsEveryOwnersPages) {
  Contract contract = *ParseContract(OneGroupWire());
  EXPECT_EQ(contract.VirtualBlockCount("history"), 6);
  contract.group_specs[0].shard_count = 4;
  EXPECT_EQ(contract.VirtualBlockCount("history"), 1 + 5 * 4);
  EXPECT_EQ(contract.VirtualBlockCount(contract.plan.groups[0]), 21);
  EXPECT_EQ(contract.VirtualBlockCount("absent"), 0);
}

TEST(ContractR2RulesTest, VirtualBlockCountMustStayWithin2To52) {
  auto with = [](int64_t shards) {
    return Edited(OneGroupWire(), [&](ordered_json& root) {
      root["plan"]["groups"][0]["page_count"] = (int64_t{1} << 40) + 1;
      root["group_specs"][0]["shard_count"] = shards;
    });
  };
  EXPECT_TRUE(ParseContract(with(1 << 11)).ok());  // 1 + 2^51
  ExpectRefused(with(1 << 12), "group_specs[0].shard_count");
  ExpectRefused(with(int64_t{1} << 52), "group_specs[0].shard_count");
}

// --- Writing either form ---------------------------------------------------------------------

TEST(ContractWriteTest, TheSnapshotFormRefusesAShardedGroup) {
  Contract contract = *ParseContract(OneGroupWire());
  contract.group_specs[0].shard_count = 2;
  absl::StatusOr<std::string> wire = SerializeContract(contract, Revision::kSnapshot);
  ASSERT_FALSE(wire.ok());
  EXPECT_EQ(CategoryOf(wire.status()), ErrorCategory::kInvalidContract);
  EXPECT_NE(wire.status().message().find("group 'history'"), absl::string_view::npos)
      << wire.status();
  EXPECT_TRUE(SerializeContract(contract, Revision::k2026_09).ok());
}

TEST(ContractWriteTest, TheSnapshotFormRefusesResidentBlockBytes) {
  Contract contract = *ParseContract(OneGroupWire());
  contract.plan.resident_block_bytes = 16;
  absl::StatusOr<std::string> wire = SerializeContract(contract, Revision::kSnapshot);
  ASSERT_FALSE(wire.ok());
  EXPECT_EQ(CategoryOf(wire.status()), ErrorCategory::kInvalidContract);
  EXPECT_NE(wire.status().message().find("plan.resident_block_bytes"), absl::string_view::npos)
      << wire.status();
}

TEST(ContractWriteTest, TheSnapshotFormLeavesReplayableOut) {
  const std::string replayable =
      R2Case("valid", "replayable_sliding")["canonical_wire"].get<std::string>();
  Contract contract = *ParseContract(replayable);
  ASSERT_TRUE(contract.group_specs[0].replayable);
  absl::StatusOr<std::string> wire = SerializeContract(contract, Revision::kSnapshot);
  ASSERT_TRUE(wire.ok()) << wire.status();
  EXPECT_EQ(*wire, InSnapshotForm(replayable));
  EXPECT_FALSE(ParseContract(*wire)->group_specs[0].replayable);
}

TEST(ContractWriteTest, The2026_09FormRefusesASpecItsReferenceRefuses) {
  Contract snapshot = *ParseContract(InSnapshotForm(Edited(
      OneGroupWire(), [](ordered_json& root) { root["group_specs"][0]["family"] = "state"; })));
  absl::StatusOr<std::string> wire = SerializeContract(snapshot, Revision::k2026_09);
  ASSERT_FALSE(wire.ok());
  EXPECT_EQ(CategoryOf(wire.status()), ErrorCategory::kInvalidContract);
  EXPECT_NE(wire.status().message().find("group 'history'"), absl::string_view::npos)
      << wire.status();
  EXPECT_TRUE(SerializeContract(snapshot).ok());
}

TEST(ContractWriteTest, The2026_09FormWritesResidentBlockBytesLastInThePlan) {
  Contract contract = *ParseContract(OneGroupWire());
  contract.plan.resident_block_bytes = 16;
  const std::string wire = *SerializeContract(contract);
  EXPECT_NE(wire.find(R"(,"resident_block_bytes":16},"group_specs")"), std::string::npos) << wire;
  EXPECT_EQ(ParseContract(wire)->plan.resident_block_bytes, 16);
}

// --- The peer check --------------------------------------------------------------------------

TEST(ContractPeerTest, ReplayableMustMatch) {
  const Contract prefill =
      *ParseContract(R2Case("valid", "replayable_sliding")["canonical_wire"].get<std::string>());
  Contract decode = prefill;
  decode.group_specs[0].replayable = false;
  absl::Status status = CheckPeerContracts(prefill, decode);
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kIncompatiblePeer);
  EXPECT_NE(status.message().find("group 'swa' replayable differs"), absl::string_view::npos)
      << status;
}

// A snapshot-form decode contract cannot state replayable, and replayable changes no slot
// selection (§12.1): a replayable prefill group meets it, where the newer reference cannot.
TEST(ContractPeerTest, ReplayableIsComparedOnlyWhenBothFormsCanStateIt) {
  const Contract prefill =
      *ParseContract(R2Case("valid", "replayable_sliding")["canonical_wire"].get<std::string>());
  absl::StatusOr<std::string> snapshot_wire = SerializeContract(prefill, Revision::kSnapshot);
  ASSERT_TRUE(snapshot_wire.ok()) << snapshot_wire.status();
  const Contract decode = *ParseContract(*snapshot_wire);
  ASSERT_EQ(decode.revision, Revision::kSnapshot);
  EXPECT_FALSE(decode.group_specs[0].replayable);
  EXPECT_TRUE(CheckPeerContracts(prefill, decode).ok());
  EXPECT_TRUE(CheckPeerContracts(decode, prefill).ok());
}

TEST(ContractPeerTest, ShardCountIsNotCompared) {
  Contract prefill = *ParseContract(OneGroupWire());
  const Contract decode = prefill;
  prefill.group_specs[0].shard_count = 4;
  EXPECT_TRUE(CheckPeerContracts(prefill, decode).ok());
}

TEST(ContractPeerTest, PeersOfEitherFormAreCompatible) {
  const Contract revised = *ParseContract(OneGroupWire());
  const Contract snapshot = *ParseContract(InSnapshotForm(OneGroupWire()));
  EXPECT_TRUE(CheckPeerContracts(revised, snapshot).ok());
  EXPECT_TRUE(CheckPeerContracts(snapshot, revised).ok());
}

}  // namespace
}  // namespace kvrail::layout
