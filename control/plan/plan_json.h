// JSON views of a plan, in exactly the schema of `result` in tests/data/cachepd/planner.json
// (VECTORS.md), for `kvrail plan` and for comparing against the vectors. Errors are kvrail's
// own: {"category": "<CategoryName>", "message": "<text>"} where the vectors carry the
// reference's Python exception.
#ifndef KVRAIL_CONTROL_PLAN_PLAN_JSON_H_
#define KVRAIL_CONTROL_PLAN_PLAN_JSON_H_

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/plan/fragment.h"
#include "control/plan/planner.h"

namespace kvrail::plan {

// {group_id, field_id, src_byte_offset, dst_byte_offset, src_row_stride_bytes,
//  dst_row_stride_bytes, bytes_per_row, rows_per_page}.
nlohmann::ordered_json FragmentToJson(const Fragment& fragment);

// {"category": ..., "message": ...}; category "error" for a status without one. `status`
// must not be OK.
nlohmann::ordered_json ErrorToJson(const absl::Status& status);

// The ok shape: {"ok": true, decode_ranks_by_prefill_rank, decode_ranks (each with its route
// and targets, or its error), prefill_registrations (every (p, d) pair, p-major),
// required_counts}. When the prefill shards groups (§12.8), also "sharded_group_ids", and each
// source and registration carries "owner_filters": {group_id: {owner_rank, owner_count} or
// null for "none"}, as dcp_r2.json spells them. Computes every route and every registration: P * D
// registrations, so meant for inspection, not for the data path.
nlohmann::ordered_json PlanToJson(const Planner& planner);

// PlanToJson of the planner, or, when Create failed,
// {"ok": false, "stage": "planner_constructor", "error": ErrorToJson(...)}.
nlohmann::ordered_json PlanToJson(const absl::StatusOr<Planner>& planner);

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_PLAN_JSON_H_
