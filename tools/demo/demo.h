// `kvrail demo`: a small disaggregated serving loop on this machine, every byte checked.
//
// Starts a bootstrap server, P prefill sidecars with their engine-sims and D decode sidecars
// with theirs, as processes; routes N rooms through them, `concurrency` at a time, with prompt
// lengths drawn from [min_prompt, max_prompt]; verifies every byte (each decode engine-sim
// checks its slice) and every streamed token (against ExpectedTokens); shows a progress bar and
// ends with a summary table: the transfer (the data plane's rate and the rooms' time from Ready
// to Success) apart from the end-to-end figures, and which bounds which. The processes' logs go
// to files, one per process, named at the end; a child that fails is named with its reason.
// Returns non-OK on any failure.
#ifndef KVRAIL_TOOLS_DEMO_DEMO_H_
#define KVRAIL_TOOLS_DEMO_DEMO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "control/layout/kv_shape.h"

namespace kvrail::demo {

struct DemoOptions {
  std::string kvrail;  // the kvrail binary to start the processes with
  int prefill_tp = 2;
  int decode_tp = 1;
  int prefill_pp = 1;  // pipeline stages of the prefill node
  // What carries the bytes between the ranks: shm or tcp (UCX), or verbs (the raw verbs backend;
  // its provider from `verbs_provider`).
  std::string link = "shm";
  // Verbs: "libibverbs" or "softverbs" (the software provider, never hardware); empty: the
  // environment variable KVRAIL_VERBS_PROVIDER, else libibverbs.
  std::string verbs_provider;
  std::string arena = "sidecar";  // who allocates the KV arenas: sidecar or engine
  int rooms = 24;
  int concurrency = 4;
  int64_t min_prompt = 512;
  int64_t max_prompt = 4096;
  uint64_t seed = 1;
  layout::KvShape shape;  // pages: per rank; 0 = enough for `concurrency` longest prompts
  int decode_tokens = 8;
  bool json = false;  // print the summary as JSON instead of a table
  // Where each process's stderr goes (<log_dir>/<process>.log); empty: a new directory under
  // $TMPDIR (else /tmp).
  std::string log_dir;
  // Every sidecar runs with --verify-digest (docs/SECURITY.md, "Digests"): to measure its cost.
  bool verify_digest = false;
  // Every sidecar stages its engine's arena through a host mirror as it would a GPU arena that
  // its transport cannot reach (SidecarOptions::emulate_gpu_arena). Needs arena "engine".
  bool emulate_gpu_arena = false;
  // Every decode sidecar offers this much row staging memory (--row-staging-bytes; docs/
  // PROTOCOL.md A.8): head-sliced rows that land apart go back to back into a slot, scattered
  // by the decode. 0: none.
  uint64_t row_staging_bytes = 0;
  // The routes that staging serves, as every decode sidecar's --row-staging: "auto" (rows that
  // land apart on a transport that writes them one by one) or "all" (every route whose rows
  // land apart).
  std::string row_staging = "auto";
  // The bootstrap server and every sidecar serve GET /metrics on a free port; the demo prints
  // the addresses and a prometheus.yml scrape config, and with metrics_hold_seconds keeps the
  // cluster up that long after the rooms, for a person to scrape.
  bool metrics = false;
  int metrics_hold_seconds = 0;
};

absl::Status RunDemo(DemoOptions options);

}  // namespace kvrail::demo

#endif  // KVRAIL_TOOLS_DEMO_DEMO_H_
