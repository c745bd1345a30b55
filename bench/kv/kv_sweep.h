// The sweep of `kvrail bench kv`: every (link, preset, tokens, TP pair) case of the
// options through a KvCaseRunner (kv_engine.h), each beside its contiguous baseline: rooms of
// the same bytes as a single copy, 1:1, through the same sidecars, link and path, in a
// second cluster whose rooms alternate with the case's (the machine is shared, and its load
// changes by the second). A case's efficiency is its GB/s over its baseline's. With --naive and
// --digest, more clusters run the case with --naive-copies or --verify-digest beside both.
#ifndef KVRAIL_BENCH_KV_KV_SWEEP_H_
#define KVRAIL_BENCH_KV_KV_SWEEP_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "bench/kv/kv_flags.h"
#include "bench/kv/kv_result.h"
#include "control/layout/kv_shape.h"

namespace kvrail::bench {

struct KvSweepSettings {
  std::string kvrail;  // the binary the sidecars run
  // A case whose room would pass this many bytes (per side) is skipped with a note: both arenas
  // of a room live in this machine's memory.
  uint64_t max_room_bytes = uint64_t{4} << 30;
  // A case runs beside its baseline (4 arenas of a room's bytes at once, 2 more per variant)
  // while they fit in this; otherwise the baseline runs after the case, and a note says so.
  uint64_t max_arena_bytes = uint64_t{12} << 30;
  std::FILE* progress = nullptr;  // a bar on it when it is a terminal
  // The sidecars' logs; empty: a fresh /tmp directory, removed when the whole sweep passed.
  std::string log_dir;
};

// The contiguous layout of `bytes` per room of `pages` pages (fewer, shape.pages, when `bytes`
// does not split into 32-byte units over that many): one layer, one replicated field whose
// pages follow each other in the arena, so the room's copies coalesce into one per 4 MiB
// (plan::kMostMergedBytes).
// InvalidArgument when `bytes` is not a whole number of 32-byte units.
absl::StatusOr<layout::KvShape> ContiguousShape(uint64_t bytes, int64_t pages);

// Runs the sweep. Skipped cases (a TP the heads do not split over, netns, too many bytes) are
// notes, not errors; the first failed case is the error, naming it.
absl::StatusOr<KvSweepResult> RunKvSweep(const KvBenchOptions& options,
                                         const KvSweepSettings& settings);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_SWEEP_H_
