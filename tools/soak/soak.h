// `kvrail soak`: real processes for a set time under faults, every byte and every event checked,
// and nothing allowed to grow (docs/RELIABILITY.md, "Soak").
//
// The run is a sequence of epochs; each starts a cluster (cluster/cluster.h: a bootstrap
// server, prefill and decode sidecars, an engine-sim per sidecar, as processes) of a random TP
// shape: prefill TP 1, 2 or 4 (PP 2 with TP up to 2), decode TP 1 or 2. Each epoch warms up
// with rooms and no fault, takes each sidecar's baseline (anonymous RSS, open fds, its tables
// from the engine API's Stats), then keeps `concurrency` rooms of random prompt lengths in
// flight until the epoch ends, injecting faults: a fraction of rooms aborted by a prefill or a
// decode engine (some while the prefill engine is still in its "forward pass": its room line
// comes late), engine-sims killed and restarted (they attach again), prefill sidecars killed
// with SIGKILL and started again. It checks, as it goes:
//   - every room ends on every engine-sim with exactly one "done" line within the room
//     deadline (a faulted room may fail; a room no fault touched must succeed);
//   - every Success's bytes (each decode engine-sim checks its slice, and reports a Success with
//     wrong bytes as "wrong") and every decoded token (against ExpectedTokens);
//   - the engine-sims' own checks (`engine-sim --audit`): no second terminal event of a room, no
//     write landing in a page after its room ended;
// and, after the epoch's rooms have ended, that each sidecar's tables are back to their
// baseline, its fds too, and its anonymous RSS within the bound (SoakOptions). The seed is
// printed first: the same seed replays the same draws.
#ifndef KVRAIL_TOOLS_SOAK_SOAK_H_
#define KVRAIL_TOOLS_SOAK_SOAK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kvrail::soak {

struct SoakOptions {
  std::string kvrail;  // the kvrail binary to start the processes with
  absl::Duration duration = absl::Minutes(2);
  // Each epoch is a new cluster of a new shape; the last one may be shorter.
  absl::Duration epoch = absl::Minutes(1);
  uint64_t seed = 0;         // 0: drawn from the system, and printed
  std::string link = "shm";  // what carries the bytes between the ranks: UCX shm or tcp
  int concurrency = 4;       // rooms in flight
  int64_t min_prompt = 16;   // prompt lengths, tokens, drawn uniformly
  int64_t max_prompt = 1024;
  // The faults to inject, any of: prefill-aborts and decode-aborts (a room given up by one of
  // its prefill or decode engines), engine-restarts (an engine-sim killed and started again),
  // sidecar-kills (a prefill sidecar killed with SIGKILL and started again).
  std::vector<std::string> faults = {"prefill-aborts", "decode-aborts", "engine-restarts",
                                     "sidecar-kills"};
  double abort_fraction = 0.1;  // rooms aborted by one of their engines
  // Mean time between process faults (engine-sim restarts, prefill sidecar kills); each next
  // one comes after a uniform draw in [0.5, 1.5] x this. Zero: none.
  absl::Duration fault_interval = absl::Seconds(8);
  // A room must end on every engine-sim within this of being issued, faulted or not. The
  // sidecars run with CachePD's bootstrap and waiting timeouts (§7.4) at `protocol_timeout`
  // (120 s and 300 s by default), so that a room whose peer vanished ends before it.
  absl::Duration room_deadline = absl::Seconds(45);
  absl::Duration protocol_timeout = absl::Seconds(20);
  // The growth bound: a sidecar's anonymous RSS (RssAnon: its heap, not the arena it shares)
  // at the end of an epoch may exceed its baseline by this much at most.
  int64_t rss_slack_kib = 16 * 1024;
  // Where each process's stderr goes (<dir>/epoch-<n>/<name>.log); empty: a new /tmp dir.
  std::string log_dir;
};

// Runs the soak, printing a progress line and a summary on stderr. OK only when every check
// held; otherwise the first violations, with the failing child's last stderr lines.
absl::Status RunSoak(const SoakOptions& options);

}  // namespace kvrail::soak

#endif  // KVRAIL_TOOLS_SOAK_SOAK_H_
