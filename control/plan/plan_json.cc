#include "control/plan/plan_json.h"

#include <optional>
#include <string>

#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

// The route's owner-filter decisions as the vectors spell them (§12.8):
// {"<group_id>": {"owner_rank": o, "owner_count": k} or null for "none", ...}.
nlohmann::ordered_json OwnerFiltersToJson(const std::vector<GroupOwnerFilter>& decisions) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const GroupOwnerFilter& d : decisions) {
    out[d.group_id] = d.filter.has_value()
                          ? nlohmann::ordered_json{{"owner_rank", d.filter->owner_rank},
                                                   {"owner_count", d.filter->owner_count}}
                          : nlohmann::ordered_json(nullptr);
  }
  return out;
}

nlohmann::ordered_json FragmentsToJson(const std::vector<Fragment>& fragments) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Fragment& fragment : fragments) {
    out.push_back(FragmentToJson(fragment));
  }
  return out;
}

}  // namespace

nlohmann::ordered_json FragmentToJson(const Fragment& fragment) {
  nlohmann::ordered_json out;
  out["group_id"] = fragment.group_id;
  out["field_id"] = fragment.field_id;
  out["src_byte_offset"] = fragment.src_byte_offset;
  out["dst_byte_offset"] = fragment.dst_byte_offset;
  out["src_row_stride_bytes"] = fragment.src_row_stride_bytes;
  out["dst_row_stride_bytes"] = fragment.dst_row_stride_bytes;
  out["bytes_per_row"] = fragment.bytes_per_row;
  out["rows_per_page"] = fragment.rows_per_page;
  return out;
}

nlohmann::ordered_json ErrorToJson(const absl::Status& status) {
  std::optional<ErrorCategory> category = CategoryOf(status);
  nlohmann::ordered_json out;
  out["category"] = std::string(category.has_value() ? CategoryName(*category) : "error");
  out["message"] = static_cast<std::string>(status.message());
  return out;
}

nlohmann::ordered_json PlanToJson(const Planner& planner) {
  const int prefill_tp = planner.prefill_tp_size();
  const int decode_tp = planner.decode_tp_size();
  nlohmann::ordered_json out;
  out["ok"] = true;
  if (!planner.sharded_group_ids().empty()) {
    out["sharded_group_ids"] = planner.sharded_group_ids();
  }

  nlohmann::ordered_json& served = out["decode_ranks_by_prefill_rank"];
  served = nlohmann::ordered_json::array();
  for (int p = 0; p < prefill_tp; ++p) {
    nlohmann::ordered_json entry;
    entry["prefill_tp_rank"] = p;
    entry["decode_tp_ranks"] = planner.DecodeRanksServedBy(p);
    served.push_back(std::move(entry));
  }

  nlohmann::ordered_json& decode_ranks = out["decode_ranks"];
  decode_ranks = nlohmann::ordered_json::array();
  for (int d = 0; d < decode_tp; ++d) {
    nlohmann::ordered_json entry;
    entry["decode_tp_rank"] = d;
    absl::StatusOr<Route> route = planner.PlanForDecodeRank(d);
    absl::StatusOr<DecodeTargets> targets = planner.TargetsFor(d);
    if (!route.ok() || !targets.ok()) {
      entry["error"] = ErrorToJson(route.ok() ? targets.status() : route.status());
      decode_ranks.push_back(std::move(entry));
      continue;
    }
    entry["whole_field_copy"] = route->whole_field_copy;
    nlohmann::ordered_json& by_rank = entry["fragments_by_prefill_rank"];
    by_rank = nlohmann::ordered_json::array();
    for (const SourceFragments& source : route->sources) {
      nlohmann::ordered_json source_json;
      source_json["prefill_tp_rank"] = source.prefill_rank;
      source_json["fragments"] = FragmentsToJson(source.fragments);
      if (!source.owner_filters.empty()) {
        source_json["owner_filters"] = OwnerFiltersToJson(source.owner_filters);
      }
      by_rank.push_back(std::move(source_json));
    }
    entry["expected_prefill_ranks"] = targets->expected_prefill_ranks;
    entry["dummy_tp_ranks"] = targets->dummy_tp_ranks;
    entry["target_tp_ranks"] = targets->target_tp_ranks;
    decode_ranks.push_back(std::move(entry));
  }

  nlohmann::ordered_json& registrations = out["prefill_registrations"];
  registrations = nlohmann::ordered_json::array();
  for (int p = 0; p < prefill_tp; ++p) {
    for (int d = 0; d < decode_tp; ++d) {
      const RegistrationOutcome outcome = planner.OnRegistration(p, d);
      nlohmann::ordered_json entry;
      entry["prefill_tp_rank"] = p;
      entry["decode_tp_rank"] = d;
      entry["outcome"] = static_cast<std::string>(OutcomeName(outcome.kind));
      if (outcome.kind == RegistrationOutcome::Kind::kReject) {
        entry["error"] = ErrorToJson(outcome.error);
      } else {
        entry["fragments"] = FragmentsToJson(outcome.fragments);
        entry["expected_decode_ranks"] = outcome.expected_decode_ranks;
        if (!outcome.owner_filters.empty()) {
          entry["owner_filters"] = OwnerFiltersToJson(outcome.owner_filters);
        }
      }
      registrations.push_back(std::move(entry));
    }
  }

  nlohmann::ordered_json& counts = out["required_counts"];
  nlohmann::ordered_json& preallocations = counts["preallocations_per_room_by_prefill_rank"];
  preallocations = nlohmann::ordered_json::array();
  for (int p = 0; p < prefill_tp; ++p) {
    preallocations.push_back(planner.RequiredPreallocations(p));
  }
  nlohmann::ordered_json& completions = counts["completions_per_room_by_decode_rank"];
  completions = nlohmann::ordered_json::array();
  for (int d = 0; d < decode_tp; ++d) {
    completions.push_back(planner.RequiredCompletions(d));
  }
  return out;
}

nlohmann::ordered_json PlanToJson(const absl::StatusOr<Planner>& planner) {
  if (planner.ok()) {
    return PlanToJson(*planner);
  }
  nlohmann::ordered_json out;
  out["ok"] = false;
  out["stage"] = "planner_constructor";
  out["error"] = ErrorToJson(planner.status());
  return out;
}

}  // namespace kvrail::plan
