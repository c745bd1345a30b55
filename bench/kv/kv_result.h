// One row of `kvrail bench kv`'s report: a case's figures, and the notes of the whole sweep
// (what was skipped, and why). Rates are decimal: GB/s is 1e9 bytes per second.
#ifndef KVRAIL_BENCH_KV_KV_RESULT_H_
#define KVRAIL_BENCH_KV_KV_RESULT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvrail::bench {

struct KvCaseResult {
  std::string shape;  // the preset, or "contiguous" for a baseline
  int prefill_tp = 1;
  int decode_tp = 1;
  int64_t tokens = 0;
  std::string link;
  // "model": the preset's rooms; "contiguous": the baseline, one copy of the same bytes per
  // room, 1:1, through the same path (the efficiency's denominator); "naive": the preset's
  // rooms with one write per row per page per field, never merged (--naive); "digest": the
  // preset's rooms with --verify-digest on every sidecar (--digest); "unpopulated": with
  // --no-populate-arena on every sidecar (--unpopulated); "rows": the preset's rooms with
  // --no-strided-copies on every sidecar, each head-sliced row its own copy as before strided
  // copies (--compare); "layerwise": the preset's rooms streamed layer by layer behind a
  // simulated forward pass (--layerwise).
  std::string mode = "model";
  int rooms = 0;
  uint64_t bytes = 0;             // per room, all prefill ranks together
  uint64_t copies = 0;            // per room before coalescing (the planner, bench side)
  uint64_t coalesced_copies = 0;  // per room, as the sidecars report (RoomEvent.copies)
  // Over the warm rooms (all rooms but the first, or the one room when there is one): bytes
  // over the data plane's seconds (the slowest prefill rank's RoomEvent.seconds per room).
  double gbps = 0;
  // The first room's GB/s: a fresh connection, and decode pages no room wrote before (the
  // sidecars populate their arenas at attach unless --no-populate-arena); -1 with one room.
  double first_room_gbps = -1;
  double p50_ms = 0;  // room latency: the Ready calls to the last decode RoomEvent
  double p99_ms = 0;
  double first_byte_ms = -1;       // the first room (fresh connection); -1: not seen
  double first_byte_warm_ms = -1;  // median over the warm rooms; -1: none
  double efficiency = 0;           // gbps / the contiguous baseline's gbps
  double naive_gain = -1;          // model rows: gbps / the naive row's gbps; -1: not measured
  uint64_t bytes_checked = 0;      // over all rooms, compared with the pattern
  // Layerwise rows (-1 otherwise): the median over warm rooms of the time from the Ready (after
  // the last layer's compute) to the last decode event, one layer's share of the model rooms'
  // transfer time (their mean data-plane seconds / layers, also the simulated compute per
  // layer at --layer-compute-scale 1), and the first over the second (the target: <= 1.5,
  // judged at scale 1); the scale (the simulated compute per layer is share x scale).
  double exposed_ms = -1;
  double layer_share_ms = -1;
  double layer_compute_scale = -1;
  double exposed_ratio = -1;
  // Over the warm rooms: the CPU seconds each side's sidecars used (all ranks, all threads,
  // from Expect to the room's last event) per GiB of the room's bytes; -1: not measured.
  double prefill_cpu_s_per_gib = -1;
  double decode_cpu_s_per_gib = -1;
};

struct KvSweepResult {
  std::vector<KvCaseResult> cases;
  std::vector<std::string> notes;  // skipped cases and layouts, one line each
  double memcpy_gbps = 0;          // single-thread memcpy on this machine, the plot's limit line
  double seconds = 0;              // the whole sweep
};

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_RESULT_H_
