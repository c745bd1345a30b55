#include "control/plan/pipeline.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

absl::Status LayoutError(absl::string_view message) {
  return MakeError(ErrorCategory::kUnsupportedLayout, message);
}

absl::StatusOr<Planner> StagePlanner(const PipelineLayout& layout, int stage, int stage_tp_size,
                                     int decode_tp_size, const layout::Contract& prefill_wire,
                                     const layout::Contract& decode) {
  const StageFilter filter = layout.FilterFor(stage);
  absl::StatusOr<Planner> planner =
      Planner::Create(stage_tp_size, decode_tp_size, prefill_wire, decode, &filter);
  if (!planner.ok()) {
    return AddContext(planner.status(), absl::StrCat("prefill stage ", stage));
  }
  return planner;
}

}  // namespace

PipelineLayout PipelineLayout::SingleStage(const layout::Contract& wire) {
  PipelineLayout single;
  single.pp_size = 1;
  single.fields_by_stage.emplace_back();
  for (const layout::FieldLayout& field : wire.plan.fields) {
    single.fields_by_stage[0].push_back(field.field_id);
  }
  return single;
}

StageFilter PipelineLayout::FilterFor(int stage) const {
  return StageFilter{fields_by_stage[stage]};
}

absl::Status ValidatePipelineLayout(const PipelineLayout& layout, const layout::Contract& wire) {
  if (layout.pp_size < 1 || layout.pp_size > kMaxTpSize) {
    return LayoutError(absl::StrCat("prefill pp_size ", layout.pp_size, " is outside 1..",
                                    kMaxTpSize, " (CACHEPD §12.3)"));
  }
  if (layout.fields_by_stage.size() != static_cast<size_t>(layout.pp_size)) {
    return LayoutError(absl::StrCat("cache_fields_by_stage has ", layout.fields_by_stage.size(),
                                    " stages but prefill_pp_size is ", layout.pp_size,
                                    " (CACHEPD §12.3)"));
  }
  absl::flat_hash_map<absl::string_view, int> stage_of;
  for (int stage = 0; stage < layout.pp_size; ++stage) {
    for (const std::string& field_id : layout.fields_by_stage[stage]) {
      if (wire.FindField(field_id) == nullptr) {
        return LayoutError(absl::StrCat("prefill stage ", stage, " holds field '", field_id,
                                        "', which the wire contract does not declare: cache stage "
                                        "placement must cover every logical field exactly once "
                                        "(CACHEPD §12.3)"));
      }
      auto [it, inserted] = stage_of.emplace(field_id, stage);
      if (!inserted) {
        return LayoutError(absl::StrCat("field '", field_id, "' is held by prefill stages ",
                                        it->second, " and ", stage,
                                        "; cache stage placement must cover every logical field "
                                        "exactly once (CACHEPD §12.3)"));
      }
    }
  }
  for (const layout::FieldLayout& field : wire.plan.fields) {
    if (!stage_of.contains(field.field_id)) {
      return LayoutError(absl::StrCat("field '", field.field_id,
                                      "' is held by no prefill stage; cache stage placement "
                                      "must cover every logical field exactly once "
                                      "(CACHEPD §12.3)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> StageTpSize(int prefill_tp_size, int prefill_dp_size, int prefill_pp_size) {
  if (prefill_tp_size < 1 || prefill_dp_size < 1 || prefill_pp_size < 1) {
    return LayoutError(absl::StrCat("prefill tp_size ", prefill_tp_size, ", dp_size ",
                                    prefill_dp_size, " and pp_size ", prefill_pp_size,
                                    " must all be positive (CACHEPD §10.5, §12.5)"));
  }
  const int64_t groups = int64_t{prefill_dp_size} * prefill_pp_size;
  if (prefill_tp_size % groups != 0 || prefill_tp_size / groups > kMaxTpSize) {
    return LayoutError(
        absl::StrCat("prefill tp_size ", prefill_tp_size, " is not dp_size * pp_size = ", groups,
                     " times a stage TP size in 1..", kMaxTpSize, " (CACHEPD §12.5)"));
  }
  return static_cast<int>(prefill_tp_size / groups);
}

absl::StatusOr<Planner> CreateStagePlanner(const PipelineLayout& layout, int stage,
                                           int stage_tp_size, int decode_tp_size,
                                           const layout::Contract& prefill_wire,
                                           const layout::Contract& decode) {
  KVRAIL_RETURN_IF_ERROR(ValidatePipelineLayout(layout, prefill_wire));
  if (stage < 0 || stage >= layout.pp_size) {
    return LayoutError(absl::StrCat("prefill stage ", stage, " is outside 0..", layout.pp_size - 1,
                                    " (CACHEPD §12.6)"));
  }
  return StagePlanner(layout, stage, stage_tp_size, decode_tp_size, prefill_wire, decode);
}

absl::StatusOr<PipelineRoute> PlanPipelineRoute(const PipelineLayout& layout, int stage_tp_size,
                                                int decode_tp_size, int decode_tp_rank,
                                                const layout::Contract& prefill_wire,
                                                const layout::Contract& decode) {
  KVRAIL_RETURN_IF_ERROR(ValidatePipelineLayout(layout, prefill_wire));
  PipelineRoute out;
  out.stage_tp_size = stage_tp_size;
  DecodeTargets& targets = out.targets;
  for (int stage = 0; stage < layout.pp_size; ++stage) {
    KVRAIL_ASSIGN_OR_RETURN(Planner planner, StagePlanner(layout, stage, stage_tp_size,
                                                          decode_tp_size, prefill_wire, decode));
    absl::StatusOr<Route> route = planner.PlanForDecodeRank(decode_tp_rank);
    if (!route.ok()) {
      return AddContext(route.status(), absl::StrCat("prefill stage ", stage));
    }
    if (layout.pp_size == 1) {
      out.whole_field_copy = route->whole_field_copy;
    }
    for (SourceFragments& source : route->sources) {
      const int global = GlobalPrefillRank(stage, stage_tp_size, source.prefill_rank);
      out.sources.push_back(PipelineSource{stage, source.prefill_rank, global,
                                           std::move(source.fragments),
                                           std::move(source.owner_filters)});
      targets.expected_prefill_ranks.push_back(global);
    }
    if (decode_tp_rank == 0) {
      for (int p = 0; p < stage_tp_size; ++p) {
        if (planner.DecodeRanksServedBy(p).empty()) {
          targets.dummy_tp_ranks.push_back(GlobalPrefillRank(stage, stage_tp_size, p));
        }
      }
    }
  }
  // Stage-major global ids are already ascending in both lists.
  std::set_union(targets.expected_prefill_ranks.begin(), targets.expected_prefill_ranks.end(),
                 targets.dummy_tp_ranks.begin(), targets.dummy_tp_ranks.end(),
                 std::back_inserter(targets.target_tp_ranks));
  return out;
}

}  // namespace kvrail::plan
