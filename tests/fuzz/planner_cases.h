// The fixed contracts of the harnesses: prefill/decode pairs of tests/data/cachepd/planner.json,
// read once from the vectors (the test's runfiles, or tests/data from the repository root,
// where tools/fuzz runs the harnesses).
#ifndef KVRAIL_TESTS_FUZZ_PLANNER_CASES_H_
#define KVRAIL_TESTS_FUZZ_PLANNER_CASES_H_

#include <string>

#include "absl/strings/string_view.h"
#include "control/layout/contract.h"

namespace kvrail::fuzz {

// One planner.json case whose contracts both describe pages inside their arenas
// (layout::CheckArenaFits), so that "inside the arena" is a property a copy can be held to.
struct PlannerCase {
  std::string name;
  int prefill_tp_size = 1;  // P and D of the case: the TP sizes its contracts were cut for
  int decode_tp_size = 1;
  layout::Contract prefill;
  layout::Contract decode;
  std::string decode_wire;  // canonical (§4.2), as a decode registers it
};

// The cases plan_fuzz picks from (its seeds name them by index): a whole-field copy (P == D),
// splits (P < D, a fan-out of 4), merges with dummy ranks (P > D), sizes that do not divide,
// and a hybrid model with sliding-window and state groups.
inline constexpr const char* kPlanCases[] = {"mha_kv8_p1_d1", "gqa_kv4_p2_d8", "mla_p4_d2",
                                             "mha_kv6_p2_d3", "qwen35_hybrid_p2_d4"};

// plan_fuzz's page-sharded cases (CACHEPD §12.8), after kPlanCases in its case index: the
// kPlanCases case `name` with every prefill group spec sharded over `shard_count` owners.
struct ShardedPlanCase {
  const char* name;
  int shard_count;
};
inline constexpr ShardedPlanCase kShardedPlanCases[] = {{"mla_p4_d2", 2}, {"mla_p4_d2", 4}};

// engine_api_fuzz's one contract, on both sides (P = D = 1): this case's decode contract (cut
// for TP 1), with three state groups (latest snapshot) and a full-history group.
inline constexpr char kEngineApiCase[] = "qwen35_hybrid_p2_d1";

// The case named `name`, parsed and checked; aborts when the vectors lack it or it does not
// parse or fit (a build mistake, not a finding).
PlannerCase LoadPlannerCase(absl::string_view name);

// LoadPlannerCase(sharded.name) with every prefill group's shard_count set, named
// "<name>_dcp<shard_count>".
PlannerCase LoadShardedPlannerCase(const ShardedPlanCase& sharded);

}  // namespace kvrail::fuzz

#endif  // KVRAIL_TESTS_FUZZ_PLANNER_CASES_H_
