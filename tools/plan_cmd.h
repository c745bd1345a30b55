// `kvrail plan`: print the route between a prefill and a decode deployment (CACHEPD §6): for
// every decode rank its targets, dummies, expected ranks and fragments per prefill rank; for
// every (prefill rank, decode rank) pair what the prefill does with that registration; and,
// given both manifests of one room, the resolved copy list before and after coalescing. Owner
// filters of page-sharded groups (CACHEPD §12.8) come from the prefill contract's shard_count.
#ifndef KVRAIL_TOOLS_PLAN_CMD_H_
#define KVRAIL_TOOLS_PLAN_CMD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvrail::tools {

struct PlanOptions {
  std::string prefill_contract_path;
  std::string decode_contract_path;
  int prefill_tp = 1;
  int decode_tp = 1;
  bool json = false;
  std::string prefill_manifest_path;  // optional, with decode_manifest_path: one room's copies
  std::string decode_manifest_path;
};

// Returns the text to print (a table, or JSON with --json), or the error to print as
// "error: <category>: <message>".
absl::StatusOr<std::string> RunPlan(const PlanOptions& options);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_PLAN_CMD_H_
