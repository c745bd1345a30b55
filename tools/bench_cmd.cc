#include "tools/bench_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/control/control_bench.h"
#include "bench/kv/kv_flags.h"
#include "bench/kv/kv_plot.h"
#include "bench/kv/kv_report.h"
#include "bench/kv/kv_sweep.h"
#include "bench/raw/raw_bench.h"
#include "bench/raw/raw_flags.h"
#include "bench/raw/raw_report.h"
#include "bench/raw/raw_target.h"
#include "tools/landing_stores_flag.h"
#include "tools/renamed_flag.h"

namespace kvrail::tools {
namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

struct RawFlags {
  std::vector<std::string> links = {"tcp,shm"};
  std::string block_sizes = "4KiB,64KiB,1MiB,64MiB";
  std::string batch_sizes = "1,32,1024";
  int lanes = 0;
  std::string inflight;
  std::string slice;
  int transfers = 0;
  transport::LandingStores landing_stores = transport::LandingStores::kAuto;
  int repeat = 2;
  double seconds = 0.5;
  bool json = false;
  bool no_peer = false;
  bool quiet = false;
  std::string netns_side;
};

struct TargetFlags {
  std::string link = "shm";
  int lanes = 2;
  uint64_t arena_bytes = 0;
  std::string net_device;
  transport::LandingStores landing_stores = transport::LandingStores::kAuto;
};

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "error: %s\n", std::string{status.message()}.c_str());
  return code;
}

std::string SelfExe() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return path;
}

int RunRaw(const RawFlags& flags) {
  bench::RawBenchOptions options;
  auto links = bench::ParseLinks("--link", flags.links);
  if (!links.ok()) return Fail(links.status(), kExitUsage);
  options.links = *links;
  auto blocks = bench::ParseBlockSizes("--block-sizes", flags.block_sizes);
  if (!blocks.ok()) return Fail(blocks.status(), kExitUsage);
  options.block_sizes = *blocks;
  auto batches = bench::ParseBatchSizes("--batch-sizes", flags.batch_sizes);
  if (!batches.ok()) return Fail(batches.status(), kExitUsage);
  options.batch_sizes = *batches;
  if (flags.lanes < 0 || flags.lanes > 16) {
    return Fail(absl::InvalidArgumentError("--lanes: between 1 and 16 (0: the default)"),
                kExitUsage);
  }
  options.lanes = flags.lanes;
  if (flags.transfers < 0 || flags.transfers > 1024) {
    return Fail(absl::InvalidArgumentError("--transfers: between 1 and 1024 (0: the default)"),
                kExitUsage);
  }
  options.transfers_per_lane = flags.transfers;
  if (!flags.inflight.empty()) {
    auto inflight = bench::ParseByteSize("--inflight", flags.inflight);
    if (!inflight.ok()) return Fail(inflight.status(), kExitUsage);
    options.inflight_bytes_per_lane = *inflight;
  }
  if (!flags.slice.empty()) {
    auto slice = bench::ParseBlockSizes("--slice", flags.slice);
    if (!slice.ok()) return Fail(slice.status(), kExitUsage);
    if (slice->size() != 1) {
      return Fail(absl::InvalidArgumentError("--slice: one size, e.g. 1MiB"), kExitUsage);
    }
    options.slice_bytes = slice->front();
  }
  if (!(flags.seconds > 0) || flags.seconds > 60) {
    return Fail(
        absl::InvalidArgumentError("--seconds: a window lasts more than 0 and at most 60 seconds"),
        kExitUsage);
  }
  options.seconds = flags.seconds;
  if (flags.repeat < 1 || flags.repeat > 10) {
    return Fail(absl::InvalidArgumentError("--repeat: between 1 and 10"), kExitUsage);
  }
  options.repeat = flags.repeat;
  options.landing_stores = flags.landing_stores;
  options.run_peer = !flags.no_peer;
  if (!flags.netns_side.empty()) {
    auto side = bench::ParseNetnsSide(flags.netns_side);
    if (!side.ok()) return Fail(side.status(), kExitUsage);
    options.netns_side = *side;
  }
  options.self_exe = SelfExe();
  options.progress = flags.quiet ? nullptr : stderr;
  // A child that dies under a write to its stdin must be an error, not our death.
  signal(SIGPIPE, SIG_IGN);
  // UCX prints its warnings on stdout (this build ignores UCX_LOG_FILE): while the bench runs,
  // stdout is stderr, for us and the children that inherit it, so that stdout carries the
  // table or the JSON alone.
  std::fflush(stdout);
  const int saved_stdout = dup(STDOUT_FILENO);
  dup2(STDERR_FILENO, STDOUT_FILENO);
  absl::StatusOr<std::vector<bench::RawRow>> rows = bench::RunRawBench(options);
  std::fflush(stdout);
  if (saved_stdout >= 0) {
    dup2(saved_stdout, STDOUT_FILENO);
    close(saved_stdout);
  }
  if (!rows.ok()) return Fail(rows.status(), kExitFailed);
  const std::string out = flags.json ? bench::RowsToJson(*rows) + "\n" : bench::RowsToTable(*rows);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

int RunTarget(const TargetFlags& flags) {
  bench::RawTargetOptions options;
  auto links = bench::ParseLinks("--link", {flags.link});
  if (!links.ok()) return Fail(links.status(), kExitUsage);
  options.link = links->front();
  options.lanes = flags.lanes;
  options.arena_bytes = flags.arena_bytes;
  options.net_device = flags.net_device;
  options.landing_stores = flags.landing_stores;
  signal(SIGPIPE, SIG_IGN);
  // The protocol gets stdout to itself; UCX's warnings (printed on stdout) go to stderr.
  std::fflush(stdout);
  const int protocol_fd = dup(STDOUT_FILENO);
  dup2(STDERR_FILENO, STDOUT_FILENO);
  std::FILE* protocol = protocol_fd >= 0 ? fdopen(protocol_fd, "w") : nullptr;
  if (protocol == nullptr) {
    return Fail(absl::InternalError("bench raw-target: cannot set up its stdout"), kExitFailed);
  }
  absl::Status status = bench::RunRawTarget(options, stdin, protocol);
  // The error first: the bench stops waiting for this process once its protocol pipe closes.
  const int code = status.ok() ? 0 : Fail(status, kExitFailed);
  std::fclose(protocol);
  return code;
}

struct KvFlags {
  bench::KvFlagText text;
  bool json = false;
  bool csv = false;
  std::string plot;
  bool quiet = false;
  double max_room_gib = 4;
  double max_arena_gib = 12;
  std::string log_dir;
};

int RunKv(const KvFlags& flags) {
  absl::StatusOr<bench::KvBenchOptions> options = bench::ParseKvFlags(flags.text);
  if (!options.ok()) return Fail(options.status(), kExitUsage);
  if (flags.json && flags.csv) {
    return Fail(absl::InvalidArgumentError("--json and --csv: give one format for stdout"),
                kExitUsage);
  }
  if (!(flags.max_room_gib > 0) || flags.max_room_gib > 1024) {
    return Fail(absl::InvalidArgumentError("--max-room-gib: more than 0 and at most 1024"),
                kExitUsage);
  }
  if (!(flags.max_arena_gib > 0) || flags.max_arena_gib > 4096) {
    return Fail(absl::InvalidArgumentError("--max-arena-gib: more than 0 and at most 4096"),
                kExitUsage);
  }
  bench::KvSweepSettings settings;
  settings.max_arena_bytes = static_cast<uint64_t>(flags.max_arena_gib * (uint64_t{1} << 30));
  settings.kvrail = SelfExe();
  settings.max_room_bytes = static_cast<uint64_t>(flags.max_room_gib * (uint64_t{1} << 30));
  settings.progress = flags.quiet ? nullptr : stderr;
  settings.log_dir = flags.log_dir;
  signal(SIGPIPE, SIG_IGN);  // a sidecar that dies must be an error, not our death
  absl::StatusOr<bench::KvSweepResult> result = bench::RunKvSweep(*options, settings);
  if (!result.ok()) return Fail(result.status(), kExitFailed);
  const std::string out = flags.json  ? bench::KvSweepToJson(*result) + "\n"
                          : flags.csv ? bench::KvSweepToCsv(*result)
                                      : bench::KvSweepToTable(*result);
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  if (!flags.plot.empty()) {
    const absl::Status plotted = bench::PlotKvSweep(*result, flags.plot);
    if (!plotted.ok()) return Fail(plotted, kExitFailed);
    if (!flags.quiet) std::fprintf(stderr, "bench kv: wrote %s\n", flags.plot.c_str());
  }
  return 0;
}

}  // namespace

// `kvrail bench kv`: model-shaped rooms through the real sidecars (bench/kv).
void AddBenchKv(CLI::App* bench, int& exit_code) {
  static KvFlags flags;
  CLI::App* kv = bench->add_subcommand(
      "kv",
      "Model-shaped rooms (Llama-3-8B/70B-like, DeepSeek-V3-like MLA) through a bootstrap and "
      "prefill and decode sidecars as processes: GB/s, room latency, first byte, efficiency "
      "against a contiguous room of the same bytes");
  kv->add_flag("--quick", flags.text.quick,
               "The representative subset: llama3-8b, 1:1 and 2:1, 4k tokens, links tcp and shm");
  kv->add_flag("--full", flags.text.full, "The default sweep plus TP 8:2 and 2:8, and netns");
  kv->add_flag("--naive", flags.text.naive,
               "Also run each case with one write per row per page per field, never merged (the "
               "prefill sidecars' --naive-copies, as per-row connectors write), beside it: rows "
               "of mode naive, and each case's gain over it (x_naive)");
  kv->add_flag("--digest", flags.text.digest,
               "Also run each case with --verify-digest on every sidecar (room digests hashed and "
               "checked before Success), beside it: rows of mode digest, whose cost they show");
  kv->add_flag("--unpopulated", flags.text.unpopulated,
               "Also run each case with --no-populate-arena on every sidecar, beside it: rows "
               "of mode unpopulated, whose first room shows what populating at attach saves");
  kv->add_flag("--compare", flags.text.compare,
               "Also run each case with each head-sliced row as a copy of its own (the sidecars' "
               "--no-strided-copies, the path before strided copies), beside it: rows of mode "
               "rows (under the default --landing-stores auto such rows store plainly, where "
               "strided rows stream: docs/decisions/0018, 0019)");
  kv->add_flag("--streaming-stores", flags.text.streaming_stores,
               "Also run each case with --landing-stores streaming on every sidecar (non-temporal "
               "stores where the lanes land bytes), beside it: rows of mode streaming");
  kv->add_flag("--layerwise", flags.text.layerwise,
               "each case also streams its rooms layer by layer (LayersReady) behind a simulated "
               "forward pass: a row of mode layerwise, with the transfer time left exposed after "
               "the last layer");
  kv->add_option("--layer-compute-scale", flags.text.layer_compute_scale,
                 "With --layerwise: the simulated compute per layer in layer shares (0.25 to 16). "
                 "1, the default, is the target's measure; more leaves the lanes idle between "
                 "layers, so what stays exposed is the last layer and the fixed path to the "
                 "decode's event")
      ->capture_default_str();
  kv->add_option("--presets", flags.text.presets,
                 "Comma list of llama3-8b, llama3-70b, deepseek-v3-mla, hybrid-swa-state");
  kv->add_option("--tp", flags.text.tp, "Comma list of <prefill TP>:<decode TP>, e.g. 1:1,2:1");
  kv->add_option("--tokens", flags.text.tokens, "Comma list of prompt lengths, e.g. 1k,4k,32k");
  kv->add_option("--link", flags.text.links,
                 "What carries the bytes between the ranks, a comma list of tcp (UCX tcp on "
                 "loopback), shm (UCX shared memory), netns (UCX tcp across two network "
                 "namespaces over a veth pair; needs root)");
  AddRenamedFlag(kv, "--transport", "--link (a comma list of tcp, shm, netns)");
  kv->add_option("--rooms", flags.text.rooms, "Rooms per case, the first on a fresh connection");
  kv->add_option("--sample-every", flags.text.sample_every,
                 "After a case's first room (checked whole), check every Nth page of each room")
      ->capture_default_str();
  kv->add_option("--max-room-gib", flags.max_room_gib,
                 "Skip cases whose room passes this many GiB on a side")
      ->capture_default_str();
  kv->add_option("--max-arena-gib", flags.max_arena_gib,
                 "Run a case beside its contiguous baseline (rooms alternating) while their four "
                 "arenas fit in this many GiB; past it, the baseline runs after the case")
      ->capture_default_str();
  kv->add_flag("--json", flags.json,
               "Print {\"cases\": [{\"shape\", \"prefill_tp\", \"decode_tp\", \"tokens\", "
               "\"link\", \"mode\", \"bytes\", \"copies\", \"coalesced_copies\", "
               "\"gbps\", \"p50_ms\", \"p99_ms\", \"first_byte_ms\", \"efficiency\", ...}]}");
  kv->add_option("--log-dir", flags.log_dir,
                 "Keep each process's log in <dir>/<case>/<run>/<process>.log (run: model, "
                 "contiguous-baseline, rows, ...; default: a new directory under /tmp, removed "
                 "when every case passed and named in the error when one failed)");
  kv->add_flag("--csv", flags.csv, "Print the cases as CSV");
  kv->add_option("--plot", flags.plot,
                 "Also draw GB/s against prompt length per link into this image (.png)");
  kv->add_flag("--quiet", flags.quiet, "No progress bar on stderr");
  kv->callback([&exit_code]() { exit_code = RunKv(flags); });
}

// `kvrail bench control`: rooms/s and latency of the whole control path (bench/control).
void AddBenchControl(CLI::App* bench, int& exit_code) {
  static kvrail::bench::ControlBenchOptions options;
  CLI::App* control = bench->add_subcommand(
      "control",
      "Rooms per second and room latency p50/p99 through the whole control path (engine API, "
      "CachePD, both sidecars), with empty payloads, 1 to 1000 rooms in flight");
  control->add_option("--in-flight", options.in_flight, "Rooms kept in flight, one row each")
      ->delimiter(',')
      ->capture_default_str();
  control->add_option("--seconds", options.seconds_per_row, "Measured seconds per row")
      ->capture_default_str();
  control
      ->add_option("--link", options.link,
                   "What carries the bytes between the two sidecars: tcp (UCX tcp on "
                   "loopback) or shm (UCX shared memory)")
      ->capture_default_str();
  AddRenamedFlag(control, "--transport", "--link (tcp or shm)");
  control->add_option("--pages", options.pages_per_room,
                      "0: empty rooms; N: N real pages per room");
  control->add_flag("--json", options.json, "Print the rows as JSON");
  control->callback([&exit_code] {
    const absl::Status checked = kvrail::bench::CheckControlBenchOptions(options);
    if (!checked.ok()) {
      exit_code = Fail(checked, kExitUsage);
      return;
    }
    const absl::Status status = kvrail::bench::RunControlBench(options);
    if (!status.ok()) {
      std::fprintf(stderr, "error: bench control: %s\n", std::string(status.message()).c_str());
      exit_code = 1;
    }
  });
}

void AddBench(CLI::App& app, int& exit_code) {
  static RawFlags raw_flags;
  static TargetFlags target_flags;
  CLI::App* bench = app.add_subcommand("bench", "Transfer benchmarks, beside the peers' tools");
  bench->require_subcommand(1);

  CLI::App* raw = bench->add_subcommand(
      "raw",
      "Write bandwidth and ops/s of the data-plane backends (UCX, verbs) between two processes, "
      "per block and "
      "batch size, through the transfer scheduler, beside ucx_perftest ucp_put_bw and memcpy");
  raw->add_option("--link", raw_flags.links,
                  "What carries the bytes between the two processes: tcp (UCX tcp on loopback), "
                  "shm (UCX shared memory), netns (UCX tcp across two network namespaces over a "
                  "veth pair; needs root) or verbs (the verbs backend, provider from "
                  "$KVRAIL_VERBS_PROVIDER; softverbs is never a bandwidth figure); repeat or "
                  "give a comma list")
      ->capture_default_str();
  AddRenamedFlag(raw, "--transport", "--link (a comma list of tcp, shm, netns, verbs)");
  AddRenamedFlag(raw, "--rooms", "--transfers (in flight per lane)");
  raw->add_option("--block-sizes", raw_flags.block_sizes,
                  "Comma list of write sizes, 1 B to 64 MiB, with B, KiB, MiB or GiB")
      ->capture_default_str();
  raw->add_option("--batch-sizes", raw_flags.batch_sizes,
                  "Comma list of writes per batch (one transfer), 1 to 1024")
      ->capture_default_str();
  raw->add_option("--lanes", raw_flags.lanes, "Lanes (UCX workers) per side; 0: per link");
  raw->add_option("--inflight", raw_flags.inflight,
                  "Bytes posted and not yet complete per lane (the scheduler's bound); also bounds "
                  "ucx_perftest -O");
  raw->add_option("--slice", raw_flags.slice, "Largest single write; longer blocks are sliced");
  tools::AddLandingStoresFlag(raw, &raw_flags.landing_stores,
                              "UCX links: how both sides' lanes store what lands, auto, plain "
                              "(memcpy) or streaming (non-temporal stores), as a sidecar's "
                              "--landing-stores");
  raw->add_option("--transfers", raw_flags.transfers,
                  "Transfers (batches) in flight per lane at most, through the scheduler (default "
                  "64)");
  raw->add_option("--seconds", raw_flags.seconds, "Measured seconds per row")
      ->capture_default_str();
  raw->add_option("--repeat", raw_flags.repeat,
                  "Best of this many runs, for kvrail and ucx_perftest alike (1 to 10)")
      ->capture_default_str();
  raw->add_flag("--json", raw_flags.json,
                "Print {\"rows\": [{\"link\", \"block_bytes\", \"batch\", \"gbps\", "
                "\"ops_per_s\", \"peer_gbps\", \"ratio\", ...}]}");
  raw->add_flag("--no-peer", raw_flags.no_peer, "Skip ucx_perftest");
  raw->add_flag("--quiet", raw_flags.quiet, "No progress on stderr");
  raw->add_option("--netns-side", raw_flags.netns_side)->group("");  // set by bench raw itself
  raw->callback([&exit_code]() { exit_code = RunRaw(raw_flags); });

  CLI::App* target = bench->add_subcommand("raw-target", "");
  target->group("");  // started by `bench raw`, not by people
  target->add_option("--link", target_flags.link);
  AddRenamedFlag(target, "--transport", "--link (tcp, shm, netns or verbs)");
  target->add_option("--lanes", target_flags.lanes);
  target->add_option("--arena-bytes", target_flags.arena_bytes)->required();
  target->add_option("--net-device", target_flags.net_device);
  tools::AddLandingStoresFlag(target, &target_flags.landing_stores, "");
  target->callback([&exit_code]() { exit_code = RunTarget(target_flags); });

  AddBenchControl(bench, exit_code);
  AddBenchKv(bench, exit_code);
}

}  // namespace kvrail::tools
