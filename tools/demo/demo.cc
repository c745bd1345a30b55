#include "tools/demo/demo.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/cluster.h"
#include "engine/base/error.h"
#include "engine/transport/factory.h"
#include "tools/engine_sim/engine_sim.h"

namespace kvrail::demo {
namespace {

using cluster::Cluster;
using cluster::ClusterOptions;
using cluster::Member;

struct RoomRecord {
  int64_t prompt = 0;
  int64_t token = 0;
  absl::Time started;
  int pending = 0;  // done lines still expected
  bool failed = false;
  std::string reason;
  absl::Duration latency;  // from its start to its last rank's done line (end to end)
  uint64_t bytes = 0;
  // The transfer alone, from the prefill ranks' "transfer" lines: the slowest rank's data-plane
  // seconds and seconds from its Ready to its Success.
  double data_plane_seconds = 0;
  double ready_to_success_seconds = 0;
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(p * (values.size() - 1) + 0.5));
  return values[i];
}

void Progress(int done, int total, uint64_t bytes, absl::Duration elapsed, int failures) {
  constexpr int kWidth = 30;
  const int filled = total == 0 ? kWidth : done * kWidth / total;
  std::fprintf(stderr, "\r  [%s%s] %d/%d rooms  %.2f GB checked  %.0f s%s",
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), done,
               total, bytes / 1e9, absl::ToDoubleSeconds(elapsed),
               failures > 0 ? absl::StrFormat("  %d FAILED", failures).c_str() : "");
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// --metrics: where each process serves GET /metrics, and a prometheus.yml that scrapes them all.
void PrintScrapeTargets(Cluster& cluster, FILE* out) {
  std::vector<const Member*> members = {&cluster.bootstrap_server()};
  for (int p = 0; p < cluster.prefill_ranks(); ++p) members.push_back(&cluster.prefill_sidecar(p));
  for (int d = 0; d < cluster.decode_ranks(); ++d) members.push_back(&cluster.decode_sidecar(d));
  std::vector<std::string> targets;
  std::fprintf(out, "\n  metrics (GET /metrics, Prometheus text format 0.0.4)\n");
  for (const Member* member : members) {
    std::fprintf(out, "  %-26s http://%s/metrics\n", member->name.c_str(), member->metrics.c_str());
    targets.push_back(absl::StrCat("'", member->metrics, "'"));
  }
  std::fprintf(out,
               "\n  prometheus.yml:\n"
               "    scrape_configs:\n"
               "      - job_name: kvrail\n"
               "        scrape_interval: 1s\n"
               "        static_configs:\n"
               "          - targets: [%s]\n\n",
               absl::StrJoin(targets, ", ").c_str());
  std::fflush(out);
}

// A directory for the processes' logs: `wanted` (made if missing), or a new one under $TMPDIR.
absl::StatusOr<std::string> LogDirectory(const std::string& wanted) {
  if (!wanted.empty()) {
    if (mkdir(wanted.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(
          absl::StrCat("--log-dir ", wanted, ": cannot make it: ", std::strerror(errno)));
    }
    return wanted;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(
      tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/kvrail-demo-",
      absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()), "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot make a log directory ", pattern, ": ", std::strerror(errno)));
  }
  return pattern;
}

// What a person can do about a child that did not start, from its reason; "" when nothing.
std::string Hint(const DemoOptions& options, absl::string_view reason) {
  if (options.link == "verbs" && absl::StrContains(reason, "lists no RDMA devices")) {
    return "this machine has no RDMA device: `kvrail demo --link verbs --verbs-provider "
           "softverbs` runs the verbs backend over the software provider (shared memory, not "
           "hardware), or use --link shm or tcp";
  }
  return "";
}

}  // namespace

absl::Status RunDemo(DemoOptions options) {
  signal(SIGPIPE, SIG_IGN);  // a child that died must not take the demo with it
  if (options.prefill_tp < 1 || options.decode_tp < 1) {
    return absl::InvalidArgumentError("--prefill-tp and --decode-tp must be >= 1");
  }
  if (options.rooms < 1 || options.concurrency < 1) {
    return absl::InvalidArgumentError("--rooms and --concurrency must be >= 1");
  }
  if (options.min_prompt < 1 || options.max_prompt < options.min_prompt) {
    return absl::InvalidArgumentError("prompt lengths: need 1 <= --min-prompt <= --max-prompt");
  }
  if (options.link != "shm" && options.link != "tcp" && options.link != "verbs") {
    return absl::InvalidArgumentError(
        absl::StrCat("--link ", options.link, ": expected shm, tcp or verbs"));
  }
  std::string data_plane = absl::StrCat("UCX ", options.link);
  if (options.link == "verbs") {
    transport::TransportSpec spec;
    spec.verbs_provider = options.verbs_provider;
    KVRAIL_ASSIGN_OR_RETURN(options.verbs_provider, transport::VerbsProviderOf(spec));
    data_plane = options.verbs_provider == "softverbs"
                     ? "verbs on softverbs (the software provider: shared memory, not hardware)"
                     : "verbs on libibverbs";
  }
  if (options.arena != "sidecar" && options.arena != "engine") {
    return absl::InvalidArgumentError(
        absl::StrCat("--arena ", options.arena, ": expected sidecar or engine"));
  }
  if (options.emulate_gpu_arena && options.arena != "engine") {
    return absl::InvalidArgumentError(
        "--emulate-gpu-arena stages an arena the engine created: give --arena engine too");
  }
  layout::KvShape& shape = options.shape;
  const int64_t longest = (options.max_prompt + shape.page_tokens - 1) / shape.page_tokens;
  if (shape.pages == 0) shape.pages = longest * options.concurrency;
  // Check the shape once here, for a clear error before any process starts.
  KVRAIL_RETURN_IF_ERROR(layout::BuildKvContract(shape, options.prefill_tp).status());
  KVRAIL_RETURN_IF_ERROR(layout::BuildKvContract(shape, options.decode_tp).status());

  std::fprintf(
      stderr,
      "kvrail demo: P=%d prefill ranks%s -> D=%d decode ranks over %s, arenas from the "
      "%s; %d layers x %d KV heads x %d dims, bf16, %d-token pages; %d rooms of %d-%d tokens, "
      "%d at a time\n",
      options.prefill_tp,
      options.prefill_pp > 1 ? absl::StrCat(" x ", options.prefill_pp, " stages").c_str() : "",
      options.decode_tp, data_plane.c_str(), options.arena.c_str(), shape.layers, shape.kv_heads,
      shape.head_dim, shape.page_tokens, options.rooms, static_cast<int>(options.min_prompt),
      static_cast<int>(options.max_prompt), options.concurrency);
  KVRAIL_ASSIGN_OR_RETURN(const std::string log_dir, LogDirectory(options.log_dir));
  ClusterOptions cluster_options;
  cluster_options.log_dir = log_dir;
  cluster_options.kvrail = options.kvrail;
  cluster_options.prefill_tp = options.prefill_tp;
  cluster_options.decode_tp = options.decode_tp;
  cluster_options.prefill_pp = options.prefill_pp;
  cluster_options.link = options.link;
  cluster_options.verbs_provider = options.verbs_provider;
  cluster_options.arena = options.arena;
  cluster_options.shape = shape;
  cluster_options.decode_tokens = options.decode_tokens;
  if (options.verify_digest) cluster_options.sidecar_args.push_back("--verify-digest");
  if (options.emulate_gpu_arena) cluster_options.sidecar_args.push_back("--emulate-gpu-arena");
  if (options.row_staging_bytes > 0) {
    cluster_options.decode_args.push_back("--row-staging-bytes");
    cluster_options.decode_args.push_back(absl::StrCat(options.row_staging_bytes));
    cluster_options.decode_args.push_back("--row-staging");
    cluster_options.decode_args.push_back(options.row_staging);
  }
  cluster_options.metrics = options.metrics;
  const int processes = 1 + 2 * (options.prefill_tp * options.prefill_pp + options.decode_tp);
  std::fprintf(stderr, "  starting %d processes (bootstrap server, sidecars, engine-sims) ...",
               processes);
  std::fflush(stderr);
  const absl::Time starting = absl::Now();
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(cluster_options);
  if (!started.ok()) {
    std::fprintf(stderr, " failed\n");
    const std::string hint = Hint(options, started.status().message());
    return absl::Status(started.status().code(),
                        absl::StrCat(started.status().message(),
                                     hint.empty() ? "" : absl::StrCat("\n  hint: ", hint),
                                     "\n  every process's log: ", log_dir));
  }
  std::unique_ptr<Cluster> cluster = *std::move(started);
  std::fprintf(stderr, " started in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - starting));
  if (options.metrics) PrintScrapeTargets(*cluster, options.json ? stderr : stdout);
  const int prefills = cluster->prefill_ranks();
  // Where the arenas live, as the engine-sims said ("ucx-shm", or "memfd,ucx-shm" if mixed).
  std::set<std::string> placement_set;
  for (int i = 0; i < cluster->sim_count(); ++i) {
    placement_set.insert(cluster->sim(i).arena_placement);
  }
  const std::string placements = absl::StrJoin(placement_set, ",");

  std::mt19937_64 random(options.seed);
  std::uniform_int_distribution<int64_t> prompt_of(options.min_prompt, options.max_prompt);
  std::map<uint64_t, RoomRecord> rooms;
  uint64_t next_room = 1;
  int done = 0, failures = 0, in_flight = 0;
  uint64_t bytes = 0, tokens_checked = 0;
  const absl::Time start = absl::Now();
  absl::Time last_line = start;
  std::vector<std::string> failure_lines;
  std::vector<std::string> notes;  // engine-sims' other lines, shown after the table
  auto issue = [&] {
    const uint64_t id = next_room++;
    RoomRecord& room = rooms[id];
    room.prompt = prompt_of(random);
    room.token = static_cast<int64_t>(id * 7919 % 32000);
    room.started = absl::Now();
    room.pending = cluster->sim_count();
    cluster->SendAll(id, room.prompt, room.token);
    ++in_flight;
  };
  while (done < options.rooms) {
    while (in_flight < options.concurrency && static_cast<int>(next_room) <= options.rooms) issue();
    std::pair<int, std::string> line;
    if (!cluster->NextLine(absl::Seconds(1), line)) {
      if (absl::Now() - last_line > absl::Seconds(120)) {
        failure_lines.push_back("no progress for 120 s: giving up");
        failures += options.rooms - done;
        break;
      }
      continue;
    }
    last_line = absl::Now();
    const std::vector<std::string> words = absl::StrSplit(line.second, ' ');
    uint64_t id = 0;
    if (words.size() >= 5 && words[0] == "transfer" && absl::SimpleAtoi(words[1], &id) &&
        rooms.count(id) != 0) {
      double data_plane = 0, ready_to_success = 0;
      if (absl::SimpleAtod(words[3], &data_plane) &&
          absl::SimpleAtod(words[4], &ready_to_success)) {
        RoomRecord& room = rooms[id];
        room.data_plane_seconds = std::max(room.data_plane_seconds, data_plane);
        room.ready_to_success_seconds = std::max(room.ready_to_success_seconds, ready_to_success);
      }
      continue;
    }
    if (!words.empty() && (words[0] == "values" || words[0] == "transfer")) continue;
    if (words.size() < 3 || words[0] != "done" || !absl::SimpleAtoi(words[1], &id) ||
        rooms.count(id) == 0) {
      // A broken promise of the engine API ("error ...") fails the demo; anything else is shown
      // after the table, not across the progress bar.
      const std::string said = absl::StrCat("engine-sim ", line.first, ": ", line.second);
      if (!words.empty() && words[0] == "error") {
        failure_lines.push_back(said);
        ++failures;
      } else {
        notes.push_back(said);
      }
      continue;
    }
    RoomRecord& room = rooms[id];
    const bool is_prefill = line.first < prefills;
    const int rank = is_prefill ? line.first : line.first - prefills;
    if (words[2] != "ok") {
      if (!room.failed) {
        room.failed = true;
        room.reason =
            absl::StrCat(is_prefill ? "prefill" : "decode", " rank ", rank, ": ",
                         line.second.substr(line.second.find(words[2]) + words[2].size() + 1));
      }
    } else if (is_prefill) {
      uint64_t b = 0;
      if (words.size() >= 4 && absl::SimpleAtoi(words[3], &b)) room.bytes += b;
    } else {
      const std::vector<int32_t> expected = sim::ExpectedTokens(
          shape, options.decode_tp, rank, id, room.prompt, room.token, options.decode_tokens);
      std::vector<int32_t> got;
      for (size_t i = 5; i < words.size(); ++i) {
        int32_t t;
        if (absl::SimpleAtoi(words[i], &t)) got.push_back(t);
      }
      if (got != expected) {
        room.failed = true;
        room.reason =
            absl::StrCat("decode rank ", rank, ": streamed tokens [", absl::StrJoin(got, " "),
                         "], expected [", absl::StrJoin(expected, " "), "]");
      } else {
        tokens_checked += got.size();
      }
    }
    if (--room.pending > 0) continue;
    room.latency = absl::Now() - room.started;
    --in_flight;
    ++done;
    bytes += room.bytes;
    if (room.failed) {
      ++failures;
      failure_lines.push_back(absl::StrCat("room ", id, ": ", room.reason));
    }
    Progress(done, options.rooms, bytes, absl::Now() - start, failures);
  }
  const absl::Duration wall = absl::Now() - start;
  if (options.metrics && options.metrics_hold_seconds > 0) {
    std::fprintf(stderr, "  holding the cluster %d s for scrapes (--metrics-hold)\n",
                 options.metrics_hold_seconds);
    absl::SleepFor(absl::Seconds(options.metrics_hold_seconds));
  }
  cluster->Stop();

  // End to end: from a room's start to its last rank's done line, with the engine-sims' work
  // (a prefill fills its pages, a decode checks every byte and decodes). The transfer: the
  // prefill ranks' data plane (bytes over its seconds) and the time from Ready to Success.
  std::vector<double> latencies, transfer_latencies;
  double room_seconds = 0, transfer_seconds = 0, data_plane_seconds = 0;
  uint64_t transfer_bytes = 0;
  for (const auto& [id, room] : rooms) {
    if (room.pending != 0) continue;
    latencies.push_back(absl::ToDoubleMilliseconds(room.latency));
    room_seconds += absl::ToDoubleSeconds(room.latency);
    if (room.failed || room.data_plane_seconds <= 0) continue;
    transfer_latencies.push_back(room.ready_to_success_seconds * 1e3);
    transfer_seconds += room.ready_to_success_seconds;
    data_plane_seconds += room.data_plane_seconds;
    transfer_bytes += room.bytes;
  }
  const double gbps = bytes / std::max(1e-9, absl::ToDoubleSeconds(wall)) / 1e9;
  const double transfer_gbps = transfer_bytes / std::max(1e-9, data_plane_seconds) / 1e9;
  const double transfer_share = transfer_seconds / std::max(1e-9, room_seconds);
  const bool software_verbs = options.verbs_provider == "softverbs" && options.link == "verbs";
  if (options.json) {
    std::printf(
        "{\"rooms\": %d, \"failures\": %d, \"bytes\": %llu, \"seconds\": %.3f, \"gbps\": %.3f, "
        "\"latency_ms_p50\": %.2f, \"latency_ms_p99\": %.2f, \"transfer_gbps\": %.3f, "
        "\"transfer_ms_p50\": %.2f, \"transfer_ms_p99\": %.2f, \"transfer_share\": %.3f, "
        "\"tokens_checked\": %llu, \"arena\": \"%s\", \"arena_placement\": \"%s\", "
        "\"log_dir\": \"%s\"}\n",
        options.rooms, failures, static_cast<unsigned long long>(bytes),
        absl::ToDoubleSeconds(wall), gbps, Percentile(latencies, 0.5), Percentile(latencies, 0.99),
        transfer_gbps, Percentile(transfer_latencies, 0.5), Percentile(transfer_latencies, 0.99),
        transfer_share, static_cast<unsigned long long>(tokens_checked), options.arena.c_str(),
        placements.c_str(), log_dir.c_str());
  } else {
    std::printf(
        "\n  %-26s %s\n", "route",
        absl::StrFormat("P=%d -> D=%d over %s", options.prefill_tp, options.decode_tp, data_plane)
            .c_str());
    std::printf("  %-26s %s (%s)\n", "KV arenas",
                options.arena == "sidecar" ? "allocated by each sidecar" : "created by each engine",
                placements.c_str());
    std::printf("  %-26s %d (%d failed)\n", "rooms", options.rooms, failures);
    std::printf("  %-26s %.2f GB (every byte checked by its decode rank)\n", "KV bytes moved",
                bytes / 1e9);
    std::printf("  %-26s %.2f GB/s: a room's bytes over its data-plane time%s\n", "transfer rate",
                transfer_gbps,
                software_verbs ? " (software provider: not a bandwidth figure)" : "");
    std::printf("  %-26s p50 %.1f ms, p99 %.1f ms\n", "transfer, Ready -> Success",
                Percentile(transfer_latencies, 0.5), Percentile(transfer_latencies, 0.99));
    std::printf("  %-26s p50 %.1f ms, p99 %.1f ms (the engine-sims fill, check and decode)\n",
                "room, end to end", Percentile(latencies, 0.5), Percentile(latencies, 0.99));
    std::printf("  %-26s %.2f GB/s: %.2f GB in %.2f s of wall time\n", "end to end", gbps,
                bytes / 1e9, absl::ToDoubleSeconds(wall));
    std::printf("  %-26s %s: the transfer is %.0f %% of a room's end-to-end time\n", "bounded by",
                transfer_share < 0.5
                    ? "the engine-sims (they fill and check every byte's pattern on this CPU)"
                    : "the transfer",
                100 * transfer_share);
    std::printf("  %-26s %llu, all as expected\n", "decoded tokens checked",
                static_cast<unsigned long long>(tokens_checked));
    std::printf("  %-26s %s (one file per process)\n", "logs", log_dir.c_str());
  }
  for (const std::string& note : notes) std::fprintf(stderr, "  %s\n", note.c_str());
  for (const std::string& failure : failure_lines) {
    std::fprintf(stderr, "  FAILED %s\n", failure.c_str());
  }
  if (failures > 0) {
    // The sidecars' side of it: the end of each one's log.
    std::vector<const Member*> sidecars;
    for (int p = 0; p < cluster->prefill_ranks(); ++p)
      sidecars.push_back(&cluster->prefill_sidecar(p));
    for (int d = 0; d < cluster->decode_ranks(); ++d)
      sidecars.push_back(&cluster->decode_sidecar(d));
    for (const Member* sidecar : sidecars) {
      std::fprintf(stderr, "\n  the end of %s:\n%s", sidecar->log.c_str(),
                   cluster::LogTail(sidecar->log, 10).c_str());
    }
    return absl::InternalError(absl::StrCat(failures, " of ", options.rooms,
                                            " rooms failed (every process's log: ", log_dir, ")"));
  }
  return absl::OkStatus();
}

}  // namespace kvrail::demo
