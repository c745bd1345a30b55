#include "control/plan/vector_cases.h"

#include <cstdio>
#include <cstdlib>

#include "absl/status/statusor.h"
#include "tests/support/vectors.h"

namespace kvrail::plan::testing {
namespace {

layout::Contract ParseOrDie(const std::string& name, const nlohmann::json& wire) {
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(wire.get<std::string>());
  if (!contract.ok()) {
    std::fprintf(stderr, "vector %s: contract does not parse: %s\n", name.c_str(),
                 contract.status().ToString().c_str());
    std::abort();
  }
  return *std::move(contract);
}

}  // namespace

layout::Contract ReadR2Contract(const std::string& name, const nlohmann::json& wire) {
  layout::Contract contract = ParseOrDie(name, wire);
  if (contract.revision != layout::Revision::k2026_09) {
    std::fprintf(stderr, "vector %s: contract is not in the 2026-09 form\n", name.c_str());
    std::abort();
  }
  return contract;
}

std::vector<GroupOwnerFilter> OwnerFiltersFromJson(const nlohmann::json& by_group) {
  std::vector<GroupOwnerFilter> decisions;
  for (const auto& [group_id, filter] : by_group.items()) {
    GroupOwnerFilter decision{group_id, std::nullopt};
    if (!filter.is_null()) {
      decision.filter =
          OwnerFilter{filter.at("owner_rank").get<int>(), filter.at("owner_count").get<int>()};
    }
    decisions.push_back(std::move(decision));
  }
  return decisions;
}

const nlohmann::json& PlannerCases() {
  static const nlohmann::json* cases =
      new nlohmann::json(kvrail::testing::LoadVectors("planner.json").at("cases"));
  return *cases;
}

const nlohmann::json& DescriptorCases() {
  static const nlohmann::json* cases =
      new nlohmann::json(kvrail::testing::LoadVectors("descriptors.json").at("cases"));
  return *cases;
}

PlannerCase ReadPlannerCase(const nlohmann::json& entry) {
  PlannerCase c;
  c.name = entry.at("name").get<std::string>();
  c.prefill_tp = entry.at("prefill_tp_size").get<int>();
  c.decode_tp = entry.at("decode_tp_size").get<int>();
  c.prefill = ParseOrDie(c.name, entry.at("prefill_contract"));
  c.decode = ParseOrDie(c.name, entry.at("decode_contract"));
  c.result = &entry.at("result");
  return c;
}

std::optional<ErrorCategory> CategoryOfReferenceError(const nlohmann::json& error) {
  const std::string cls = error.at("class").get<std::string>();
  if (cls == "UnsupportedPDLayoutError" || cls == "ValueError") {
    return ErrorCategory::kUnsupportedLayout;
  }
  if (cls == "CacheContractError") {
    return ErrorCategory::kIncompatiblePeer;
  }
  return std::nullopt;
}

Fragment FragmentFromJson(const nlohmann::json& json) {
  Fragment f;
  f.group_id = json.at("group_id").get<std::string>();
  f.field_id = json.at("field_id").get<std::string>();
  f.src_byte_offset = json.at("src_byte_offset").get<int64_t>();
  f.dst_byte_offset = json.at("dst_byte_offset").get<int64_t>();
  f.src_row_stride_bytes = json.at("src_row_stride_bytes").get<int64_t>();
  f.dst_row_stride_bytes = json.at("dst_row_stride_bytes").get<int64_t>();
  f.bytes_per_row = json.at("bytes_per_row").get<int64_t>();
  f.rows_per_page = json.at("rows_per_page").get<int64_t>();
  return f;
}

std::vector<Fragment> FragmentsFromJson(const nlohmann::json& json) {
  std::vector<Fragment> out;
  for (const nlohmann::json& f : json) {
    out.push_back(FragmentFromJson(f));
  }
  return out;
}

std::vector<int> IntsFromJson(const nlohmann::json& json) { return json.get<std::vector<int>>(); }

std::vector<std::string> FieldIds(const layout::Contract& contract) {
  std::vector<std::string> ids;
  for (const layout::FieldLayout& field : contract.plan.fields) {
    ids.push_back(field.field_id);
  }
  return ids;
}

}  // namespace kvrail::plan::testing
