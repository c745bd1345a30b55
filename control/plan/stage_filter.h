// The cache fields one prefill pipeline stage holds (CACHEPD §10.1). A planner given a stage
// filter plans, and its prefill rank later sends, only those fields. See pipeline.h for how
// stages combine into one decode rank's route.
#ifndef KVRAIL_CONTROL_PLAN_STAGE_FILTER_H_
#define KVRAIL_CONTROL_PLAN_STAGE_FILTER_H_

#include <string>
#include <vector>

namespace kvrail::plan {

struct StageFilter {
  // Field ids of the wire (whole-model) prefill contract that the stage holds, in any order.
  std::vector<std::string> field_ids;
};

}  // namespace kvrail::plan

#endif  // KVRAIL_CONTROL_PLAN_STAGE_FILTER_H_
