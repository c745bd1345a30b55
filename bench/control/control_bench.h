// `kvrail bench control`: rooms per second and room latency through the whole control path, with
// empty payloads, on this machine.
//
// In this process: a bootstrap server, one prefill sidecar and one decode sidecar (P = 1,
// D = 1, control/sidecar), each with a small shared-memory arena attached through its engine
// API, and two engine API clients acting as the two engines. Each room runs the whole control
// path (docs/ARCHITECTURE.md, "One request, end to end"): Expect on the decode (its
// registration once, a pre-allocation per room over CachePD, CACHEPD §3.2, §3.3), Ready on the
// prefill, the prefill's transfer (the scheduler, with no copy to post) and status frame back
// (§3.4), and the decode's Success RoomEvent.
//
// "Empty payload": the arenas' one cache group keeps a sliding window of 1 token, so a room
// whose prompt ends on a block boundary carries no block at all (CACHEPD §5.2: the slot range
// [ceil(prompt/g), ceil(prompt/g)) is empty) and moves no byte. A manifest whose prefix covers
// the prompt is not allowed (§5.3 requires prefix_len < prompt_len). pages_per_room > 0 uses a
// full-history group instead and moves that many pages per room.
//
// A row keeps N rooms in flight (closed loop: a room starts when one ends), warms up, then
// measures a window: rooms completed in it per second, and the latency of each from its
// Expect's send to the decode's Success event. Every room must succeed on both sides. In a
// closed loop the mean latency is N / (rooms per second) (Little's law), so a last, paced row
// offers the target rate instead (rooms start on a clock, at most N in flight) and shows the
// latency at that rate.
#ifndef KVRAIL_BENCH_CONTROL_CONTROL_BENCH_H_
#define KVRAIL_BENCH_CONTROL_CONTROL_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvrail::bench {

struct ControlBenchOptions {
  // One row per entry: rooms kept in flight (1 to 100000).
  std::vector<int> in_flight = {1, 10, 100, 1000};
  // The measured window of each row, after its warm-up.
  double seconds_per_row = 1.0;
  double warmup_seconds = 0.2;
  // RunControlBench prints JSON instead of the table.
  bool json = false;
  // What carries the bytes between the two sidecars: "tcp" (UCX tcp on loopback) or "shm" (UCX
  // shared memory).
  std::string link = "tcp";
  // The engine API sockets: "ipc" (a Unix socket under /tmp, as deployments use) or "tcp".
  std::string engine_api = "ipc";
  // 0: empty payloads (see above). Otherwise pages of a tiny full-history contract per room.
  int pages_per_room = 0;
  // After the closed-loop rows, one paced row: target_rooms_per_s offered, at most
  // target_in_flight in flight.
  bool paced_target_row = true;
  // A line per row on stderr.
  bool progress = true;
  // The target: at target_in_flight rooms in flight, at least target_rooms_per_s and
  // a p99 latency of at most target_p99_ms.
  int target_in_flight = 100;
  double target_rooms_per_s = 20000;
  double target_p99_ms = 1.0;
};

struct ControlBenchRow {
  int in_flight = 0;   // closed loop: rooms kept in flight; paced: the most in flight
  double rate = 0;     // paced: rooms/s offered; 0 for a closed loop
  uint64_t rooms = 0;  // rooms that completed in the measured window
  double seconds = 0;  // the window
  double rooms_per_s = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
  // CPU time of the whole process (sidecars, bootstrap, engines) per room over the window:
  // what a room costs, whatever else the machine runs.
  double cpu_us_per_room = 0;
  // Paced: starts in the window held back because in_flight rooms were in flight.
  uint64_t capped = 0;
};

struct ControlBenchResult {
  std::vector<ControlBenchRow> rows;
  // What a room carries, in words ("empty: ...", or "N page(s) of B bytes").
  std::string payload;
  uint64_t payload_bytes = 0;  // per room
  // Every room run, warm-ups included; each succeeded on both sidecars (else Measure fails).
  uint64_t rooms_total = 0;
  // The target, judged on the closed-loop row at target_in_flight; measured false when there
  // is none.
  bool target_measured = false;
  bool target_rooms_met = false;
  bool target_p99_met = false;
  // The paced row: the offered rate carried (within 2%, no start capped), and its p99.
  bool paced_measured = false;
  bool paced_rate_met = false;
  bool paced_p99_met = false;
  int target_in_flight = 0;
  double target_rooms_per_s = 0;
  double target_p99_ms = 0;
};

// OK, or InvalidArgument naming the first option at fault and the rule it broke (one line).
// MeasureControlBench checks this first.
absl::Status CheckControlBenchOptions(const ControlBenchOptions& options);

// Runs the benchmark and returns its figures. InvalidArgument naming the option at fault; the
// sidecars' own error when one cannot start; Internal naming the room when a room failed, was
// refused, or ended otherwise than expected; DeadlineExceeded when rooms stall for 10 s.
absl::StatusOr<ControlBenchResult> MeasureControlBench(const ControlBenchOptions& options);

// The result as a table with the target lines, and as one JSON object:
//   {"rows":[{"in_flight":..,"rate":..,"rooms":..,"rooms_per_s":..,"p50_ms":..,"p99_ms":..,
//   "max_ms":..,"seconds":..,"cpu_us_per_room":..,"capped":..}],"payload":..,
//   "payload_bytes":..,"rooms_total":..,"target":{"in_flight":..,"rooms_per_s":..,"p99_ms":..,
//   "measured":..,"rooms_per_s_met":..,"p99_met":..,"pass":..,"paced_measured":..,
//   "paced_rate_met":..,"paced_p99_met":..}}
std::string FormatControlBenchTable(const ControlBenchResult& result);
std::string FormatControlBenchJson(const ControlBenchResult& result);

// MeasureControlBench, then prints the table (or the JSON, options.json) on stdout. A missed
// target is reported in the output, not as an error.
absl::Status RunControlBench(const ControlBenchOptions& options);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_CONTROL_CONTROL_BENCH_H_
