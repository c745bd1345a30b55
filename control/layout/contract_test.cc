#include "control/layout/contract.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::layout {
namespace {

using kvrail::testing::LoadVectors;
using kvrail::testing::VectorInput;

const nlohmann::json& Contracts() {
  static const nlohmann::json* vectors = new nlohmann::json(LoadVectors("contracts.json"));
  return *vectors;
}

// Valid vectors that the reference accepts and kvrail should too parse to the reference's
// canonical wire; those marked strict_recommendation "reject" are refused with a clear error.
TEST(ContractVectorsTest, ValidCasesMatchReferenceOrAreStrictlyRejected) {
  int accepted = 0, rejected = 0;
  for (const auto& entry : Contracts()["valid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> contract = ParseContract(VectorInput(entry));
    if (entry.value("strict_recommendation", "accept") == "reject") {
      ASSERT_FALSE(contract.ok());
      EXPECT_EQ(CategoryOf(contract.status()), ErrorCategory::kInvalidContract);
      ++rejected;
      continue;
    }
    ASSERT_TRUE(contract.ok()) << contract.status();
    absl::StatusOr<std::string> wire = SerializeContract(*contract);
    ASSERT_TRUE(wire.ok()) << wire.status();
    EXPECT_EQ(*wire, entry["result"]["canonical_wire"].get<std::string>());
    ++accepted;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

TEST(ContractVectorsTest, InvalidCasesAreRejectedAsInvalidContract) {
  for (const auto& entry : Contracts()["invalid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<Contract> contract = ParseContract(VectorInput(entry));
    ASSERT_FALSE(contract.ok());
    EXPECT_EQ(CategoryOf(contract.status()), ErrorCategory::kInvalidContract) << contract.status();
    EXPECT_NE(contract.status().message().find("CACHEPD"), absl::string_view::npos)
        << "errors cite the spec section: " << contract.status();
  }
}

TEST(ContractVectorsTest, CanonicalWiresRoundTripExactly) {
  for (const auto& entry : Contracts()["valid"]) {
    if (entry.value("strict_recommendation", "accept") == "reject") continue;
    const std::string canonical = entry["result"]["canonical_wire"].get<std::string>();
    absl::StatusOr<Contract> contract = ParseContract(canonical);
    ASSERT_TRUE(contract.ok()) << contract.status();
    EXPECT_EQ(*SerializeContract(*contract), canonical);
  }
}

std::string SmallContract() {
  return Contracts()["valid"][0]["result"]["canonical_wire"].get<std::string>();
}

TEST(ContractTest, ErrorsNameTheMember) {
  std::string wire = SmallContract();
  wire.replace(wire.find("\"bfloat16\""), 10, "\"bfloat17\"");
  absl::StatusOr<Contract> contract = ParseContract(wire);
  ASSERT_FALSE(contract.ok());
  EXPECT_NE(contract.status().message().find("plan.fields[0].dtype"), absl::string_view::npos)
      << contract.status();
  EXPECT_NE(contract.status().message().find("bfloat17"), absl::string_view::npos);
}

TEST(ContractTest, RejectsDuplicateMembersAndBom) {
  std::string wire = SmallContract();
  std::string dup = "{\"plan\":1," + wire.substr(1);
  EXPECT_FALSE(ParseContract(dup).ok());
  EXPECT_NE(ParseContract(dup).status().message().find("appears twice"), absl::string_view::npos);
  EXPECT_FALSE(ParseContract("\xEF\xBB\xBF" + wire).ok());
}

TEST(ContractTest, RejectsDeepNestingWithoutRecursion) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  absl::StatusOr<Contract> contract = ParseContract(deep);
  ASSERT_FALSE(contract.ok());
  EXPECT_NE(contract.status().message().find("nesting"), absl::string_view::npos);
}

TEST(ContractTest, IgnoresUnknownTopLevelMembersButNotRecordMembers) {
  std::string wire = SmallContract();
  std::string extra_top = "{\"future\":{\"x\":1}," + wire.substr(1);
  ASSERT_TRUE(ParseContract(extra_top).ok());
  EXPECT_EQ(*SerializeContract(*ParseContract(extra_top)), wire);
  std::string extra_field = wire;
  extra_field.replace(extra_field.find("\"page_stride_bytes\":48"), 22,
                      "\"page_stride_bytes\":48,\"x\":1");
  EXPECT_FALSE(ParseContract(extra_field).ok());
}

TEST(ContractTest, NonAsciiIsEscapedLowercaseWithSurrogates) {
  std::string wire = SmallContract();
  std::string raw = wire;
  // U+1F600 (4-byte UTF-8) and DEL in the group id, everywhere it appears.
  const std::string from = "\"group_id\":\"history\"";
  const std::string to = "\"group_id\":\"hist\xF0\x9F\x98\x80\x7Fory\"";
  size_t pos;
  while ((pos = raw.find(from)) != std::string::npos) raw.replace(pos, from.size(), to);
  absl::StatusOr<Contract> contract = ParseContract(raw);
  ASSERT_TRUE(contract.ok()) << contract.status();
  std::string canonical = *SerializeContract(*contract);
  EXPECT_NE(canonical.find("hist\\ud83d\\ude00\\u007fory"), std::string::npos) << canonical;
}

TEST(ContractTest, PeerCheckNamesTheDifference) {
  Contract a = *ParseContract(SmallContract());
  Contract b = a;
  EXPECT_TRUE(CheckPeerContracts(a, b).ok());
  b.plan.prefix_granularity = 4;
  absl::Status status = CheckPeerContracts(a, b);
  EXPECT_EQ(CategoryOf(status), ErrorCategory::kIncompatiblePeer);
  EXPECT_NE(status.message().find("prefix_granularity"), absl::string_view::npos);
  b = a;
  b.plan.fields[0].dtype = DType::kFloat16;
  EXPECT_NE(CheckPeerContracts(a, b).message().find("dtype"), absl::string_view::npos);
  b = a;
  b.group_specs[0].rows_per_page = 4;
  EXPECT_NE(CheckPeerContracts(a, b).message().find("rows_per_page"), absl::string_view::npos);
}

TEST(ContractTest, PeerCheckAllowsDifferentLocalExtentsWithSameGlobalShape) {
  // layer.0.k is split on axis 1 with global extent 4: local 2 (TP 2) vs local 4 (TP 1).
  Contract tp1 = *ParseContract(SmallContract());
  Contract tp2 = tp1;
  FieldLayout* k = nullptr;
  for (FieldLayout& f : tp2.plan.fields) {
    if (f.field_id == "layer.0.k") k = &f;
  }
  ASSERT_NE(k, nullptr);
  k->shape[1] = tp1.FindField("layer.0.k")->shape[1] / 2;
  ASSERT_TRUE(ValidateContract(tp2).ok()) << ValidateContract(tp2);
  EXPECT_TRUE(CheckPeerContracts(tp1, tp2).ok());
  k->shape[0] += 1;
  EXPECT_FALSE(CheckPeerContracts(tp1, tp2).ok());
}

TEST(ContractTest, PageOffsetFollowsTheArenaFormula) {
  Contract c = *ParseContract(SmallContract());
  const FieldLayout* k = c.FindField("layer.0.k");
  const PlaneLayout* plane = c.FindPlane(k->plane_id);
  for (int64_t page = 0; page < c.FindGroup(k->group_id)->page_count; ++page) {
    EXPECT_EQ(*PageOffset(c, *k, page), plane->arena_offset_bytes + plane->bytes_per_lcm_block -
                                            k->page_stride_bytes + page * k->page_stride_bytes +
                                            k->field_offset_bytes);
  }
  EXPECT_FALSE(PageOffset(c, *k, c.FindGroup(k->group_id)->page_count).ok());
  EXPECT_FALSE(PageOffset(c, *k, -1).ok());
}

TEST(ContractTest, ArenaFitCheckCatchesOutOfArenaPlanes) {
  Contract c = *ParseContract(SmallContract());
  // The reference's test contract places planes past its arena; kvrail flags it on attach.
  EXPECT_FALSE(CheckArenaFits(c).ok());
  c.plan.lcm_block_bytes = 4096;
  EXPECT_TRUE(CheckArenaFits(c).ok()) << CheckArenaFits(c);
}

// Randomised byte mutations of a valid wire never crash and are either accepted (then
// re-serialise to a wire that parses to the same canonical form) or rejected with a category.
TEST(ContractTest, RandomMutationsAreAcceptedCanonicallyOrRejectedCleanly) {
  std::mt19937_64 rng(20261130);
  const std::string base = SmallContract();
  for (int i = 0; i < 3000; ++i) {
    std::string wire = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % wire.size();
      switch (rng() % 3) {
        case 0:
          wire[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          wire.erase(at, 1 + rng() % 8);
          break;
        default:
          wire.insert(at, 1, "{}[]\",:0123456789-e."[rng() % 21]);
      }
      if (wire.empty()) wire = "x";
    }
    absl::StatusOr<Contract> contract = ParseContract(wire);
    if (!contract.ok()) {
      EXPECT_EQ(CategoryOf(contract.status()), ErrorCategory::kInvalidContract);
      continue;
    }
    absl::StatusOr<std::string> canonical = SerializeContract(*contract);
    ASSERT_TRUE(canonical.ok());
    EXPECT_EQ(*SerializeContract(*ParseContract(*canonical)), *canonical);
  }
}

}  // namespace
}  // namespace kvrail::layout
