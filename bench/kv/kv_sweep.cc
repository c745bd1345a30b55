#include "bench/kv/kv_sweep.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/kv/kv_engine.h"
#include "bench/kv/kv_presets.h"
#include "bench/raw/memcpy_limit.h"
#include "cluster/netns.h"
#include "engine/base/error.h"

namespace kvrail::bench {
namespace {

struct PlannedCase {
  KvPreset preset;
  TpPair tp;
  int64_t tokens = 0;
  std::string link;
};

std::string Label(const std::string& shape, int prefill_tp, int decode_tp, int64_t tokens,
                  const std::string& link) {
  return absl::StrCat(shape, " ", prefill_tp, ":", decode_tp, " ", tokens, " tokens ", link);
}

// `text` as one part of a path: spaces and colons become '-' ("llama3-8b 2:1 4096 tokens shm"
// -> "llama3-8b-2-1-4096-tokens-shm").
std::string PathPart(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == ' ' || c == ':' || c == '/'; }, '-');
  return text;
}

// Nearest-rank percentile of `values` (not empty), q in (0, 1].
double Percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t rank =
      static_cast<size_t>(std::max(1.0, std::ceil(q * static_cast<double>(values.size()))));
  return values[std::min(rank, values.size()) - 1];
}

// The figures of one case's rooms; the first ran on a fresh connection and counts only for
// first_byte_ms (and when it is the only room).
KvCaseResult Summarise(const KvCaseFigures& figures) {
  KvCaseResult r;
  r.rooms = static_cast<int>(figures.rooms.size());
  r.copies = figures.uncoalesced_copies;
  const size_t from = figures.rooms.size() > 1 ? 1 : 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double prefill_cpu = 0;
  double decode_cpu = 0;
  std::vector<double> latencies, first_bytes;
  for (size_t i = from; i < figures.rooms.size(); ++i) {
    const KvRoomFigures& room = figures.rooms[i];
    bytes += room.bytes;
    seconds += room.data_plane_seconds;
    prefill_cpu += room.prefill_cpu_seconds;
    decode_cpu += room.decode_cpu_seconds;
    latencies.push_back(room.latency_seconds * 1e3);
    if (i > 0 && room.first_byte_seconds >= 0) first_bytes.push_back(room.first_byte_seconds);
  }
  for (const KvRoomFigures& room : figures.rooms) r.bytes_checked += room.bytes_checked;
  const KvRoomFigures& first = figures.rooms.front();
  r.bytes = first.bytes;
  r.coalesced_copies = first.coalesced_copies;
  r.gbps = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
  if (bytes > 0) {
    const double gib = static_cast<double>(bytes) / 1073741824.0;
    r.prefill_cpu_s_per_gib = prefill_cpu / gib;
    r.decode_cpu_s_per_gib = decode_cpu / gib;
  }
  if (figures.rooms.size() > 1 && first.data_plane_seconds > 0) {
    r.first_room_gbps = static_cast<double>(first.bytes) / first.data_plane_seconds / 1e9;
  }
  r.p50_ms = Percentile(latencies, 0.50);
  r.p99_ms = Percentile(latencies, 0.99);
  r.first_byte_ms = first.first_byte_seconds >= 0 ? first.first_byte_seconds * 1e3 : -1;
  if (!first_bytes.empty()) r.first_byte_warm_ms = Percentile(first_bytes, 0.5) * 1e3;
  return r;
}

class ProgressBar {
 public:
  ProgressBar(std::FILE* out, size_t total)
      : out_(out != nullptr && isatty(fileno(out)) ? out : nullptr), total_(total) {}
  ~ProgressBar() {
    if (out_ != nullptr && shown_) std::fputs("\n", out_);
  }
  void Show(size_t done, const std::string& what) {
    if (out_ == nullptr) return;
    constexpr size_t kWidth = 30;
    const size_t filled = total_ == 0 ? kWidth : done * kWidth / total_;
    std::fprintf(out_, "\r\033[K[%s%s] %zu/%zu %s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done, total_, what.c_str());
    std::fflush(out_);
    shown_ = true;
  }

 private:
  std::FILE* out_;
  size_t total_;
  bool shown_ = false;
};

// Runs `rooms` rooms of each case of `specs` (the model's, its contiguous baseline, and its
// --naive, --digest and --unpopulated variants), named by `names`: with `beside`, every cluster at
// once and their rooms in turn, so that each meets the machine (this one is shared and its load
// changes by the second) as the others do; otherwise one after the other, to hold less memory.
absl::StatusOr<std::vector<KvCaseFigures>> RunBeside(const std::vector<KvCaseSpec>& specs,
                                                     const std::vector<std::string>& names,
                                                     int rooms, bool beside) {
  std::vector<KvCaseFigures> figures(specs.size());
  std::vector<std::unique_ptr<KvCaseRunner>> runners(specs.size());
  auto start = [&](size_t i) -> absl::Status {
    // Each run's processes log in a directory of their own under the case's: the runs of a case
    // have processes of the same names, and a log file is appended to.
    KvCaseSpec spec = specs[i];
    if (!spec.log_dir.empty()) {
      spec.log_dir = absl::StrCat(spec.log_dir, "/", PathPart(names[i]));
      std::error_code made;
      std::filesystem::create_directories(spec.log_dir, made);
      if (made) {
        return absl::InternalError(
            absl::StrCat("bench kv: making ", spec.log_dir, ": ", made.message()));
      }
    }
    absl::StatusOr<std::unique_ptr<KvCaseRunner>> runner = KvCaseRunner::Start(spec);
    if (!runner.ok()) return AddContext(runner.status(), names[i]);
    runners[i] = *std::move(runner);
    figures[i].uncoalesced_copies = runners[i]->uncoalesced_copies();
    return absl::OkStatus();
  };
  auto room = [&](size_t i) -> absl::Status {
    absl::StatusOr<KvRoomFigures> room = runners[i]->NextRoom();
    if (!room.ok()) return AddContext(room.status(), names[i]);
    figures[i].rooms.push_back(*room);
    return absl::OkStatus();
  };
  if (beside) {
    for (size_t i = 0; i < specs.size(); ++i) KVRAIL_RETURN_IF_ERROR(start(i));
    for (int r = 0; r < rooms; ++r) {
      for (size_t i = 0; i < specs.size(); ++i) KVRAIL_RETURN_IF_ERROR(room(i));
    }
    return figures;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    KVRAIL_RETURN_IF_ERROR(start(i));
    for (int r = 0; r < rooms; ++r) KVRAIL_RETURN_IF_ERROR(room(i));
    runners[i].reset();  // its cluster and arenas go before the next one's come
  }
  return figures;
}

}  // namespace

absl::StatusOr<layout::KvShape> ContiguousShape(uint64_t bytes, int64_t pages) {
  layout::KvShape shape;
  shape.layers = 1;
  shape.latent = true;
  shape.dtype = layout::DType::kBfloat16;
  shape.page_tokens = 16;
  shape.prefix_granularity = 16;
  // A latent dim on every page; fewer pages when `bytes` does not split over that many (a
  // sliding window or a state group: the room's bytes are not a whole number of token rows).
  while (pages > 1 && bytes % (static_cast<uint64_t>(pages) * 32) != 0) --pages;
  shape.pages = pages;
  const uint64_t unit = static_cast<uint64_t>(pages) * 16 * 2;
  if (pages < 1 || bytes == 0 || bytes % unit != 0 || bytes / unit > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "bench kv: no contiguous layout of %d bytes in %d pages of 16 bf16 rows", bytes, pages));
  }
  shape.latent_dim = static_cast<int>(bytes / unit);
  return shape;
}

absl::StatusOr<KvSweepResult> RunKvSweep(const KvBenchOptions& options,
                                         const KvSweepSettings& settings) {
  const auto started = std::chrono::steady_clock::now();
  KvSweepResult result;
  std::vector<PlannedCase> cases;
  // netns: two hosts on this machine (cluster/netns.h), the prefill node in one network
  // namespace and the decode node in the other, joined by a veth pair; made once for the sweep.
  std::optional<cluster::NetnsPair> hosts;
  for (const std::string& link : options.links) {
    if (link == "netns") {
      absl::StatusOr<cluster::NetnsPair> pair = cluster::NetnsPair::Create();
      if (!pair.ok()) {
        result.notes.push_back(absl::StrCat("netns: skipped: ", pair.status().message()));
        continue;
      }
      hosts.emplace(*std::move(pair));
    }
    for (const std::string& name : options.presets) {
      KVRAIL_ASSIGN_OR_RETURN(const KvPreset preset, FindKvPreset(name));
      for (int64_t tokens : options.tokens) {
        for (const TpPair& tp : options.tp_pairs) {
          const std::string label = Label(name, tp.prefill, tp.decode, tokens, link);
          if (!KvShapeSplits(preset.shape, tp.prefill) || !KvShapeSplits(preset.shape, tp.decode)) {
            result.notes.push_back(absl::StrCat(label, ": skipped: ", preset.shape.kv_heads,
                                                " KV heads do not split over that TP"));
            continue;
          }
          const uint64_t bytes =
              static_cast<uint64_t>(std::max(KvRoomBytes(preset.shape, tp.prefill, tokens),
                                             KvRoomBytes(preset.shape, tp.decode, tokens)));
          if (bytes > settings.max_room_bytes) {
            result.notes.push_back(absl::StrFormat(
                "%s: skipped: a room holds %d bytes on a side, over the %d-byte bound (both "
                "arenas live in this machine's memory)",
                label, bytes, settings.max_room_bytes));
            continue;
          }
          cases.push_back({preset, tp, tokens, link});
        }
      }
    }
  }

  std::string log_dir = settings.log_dir;
  if (log_dir.empty()) {
    char dir[] = "/tmp/kvrail-bench-kv-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      return absl::InternalError("bench kv: mkdtemp /tmp/kvrail-bench-kv-XXXXXX failed");
    }
    log_dir = dir;
  }
  {
    // The limit line of the plot: what one core copies, 4 MiB at a time over 256 MiB.
    MemcpyLimit limit(uint64_t{256} << 20);
    result.memcpy_gbps =
        limit.Gbps(uint64_t{4} << 20, uint64_t{256} << 20, /*threads=*/1, absl::Seconds(0.2));
  }
  ProgressBar bar(settings.progress, cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const PlannedCase& c = cases[i];
    const std::string label = Label(c.preset.name, c.tp.prefill, c.tp.decode, c.tokens, c.link);
    bar.Show(i, label);
    KvCaseSpec spec;
    spec.kvrail = settings.kvrail;
    spec.shape = c.preset.shape;
    spec.prefill_tp = c.tp.prefill;
    spec.decode_tp = c.tp.decode;
    spec.tokens = c.tokens;
    spec.link = c.link;
    if (c.link == "netns") {
      for (auto [node, host] : {std::pair{&spec.prefill_node, &hosts->initiator()},
                                std::pair{&spec.decode_node, &hosts->target()}}) {
        node->prefix = cluster::NetnsPair::ExecPrefix(host->netns);
        node->host = host->address;
        node->net_devices = host->device;
      }
    }
    spec.sample_every = options.sample_every;
    // The case's runs log under log_dir/<case>/<run> (RunBeside).
    const std::string case_logs = absl::StrCat(log_dir, "/", PathPart(label));
    spec.log_dir = case_logs;
    // What the decode ranks hold of a room together: every byte of it once, and a replicated
    // latent once per decode rank.
    const uint64_t bytes =
        static_cast<uint64_t>(KvRoomBytes(c.preset.shape, c.tp.decode, c.tokens));
    KvCaseSpec base = spec;
    KVRAIL_ASSIGN_OR_RETURN(base.shape,
                            ContiguousShape(bytes, KvRoomPages(c.preset.shape, c.tokens)));
    base.tokens = base.shape.pages * base.shape.page_tokens;  // fewer when bytes ask it
    base.prefill_tp = 1;
    base.decode_tp = 1;
    std::vector<KvCaseSpec> specs = {spec, base};
    std::vector<std::string> names = {"model", "contiguous baseline"};
    // The variants: the model's rooms again, through sidecars with other flags.
    std::vector<std::string> variants;
    if (options.naive) variants.push_back("naive");
    if (options.digest) variants.push_back("digest");
    if (options.unpopulated) variants.push_back("unpopulated");
    if (options.compare) variants.push_back("rows");
    if (options.streaming_stores) variants.push_back("streaming");
    for (const std::string& mode : variants) {
      KvCaseSpec variant = spec;
      variant.sidecar_args.push_back(mode == "naive"         ? "--naive-copies"
                                     : mode == "digest"      ? "--verify-digest"
                                     : mode == "unpopulated" ? "--no-populate-arena"
                                     : mode == "streaming"   ? "--landing-stores=streaming"
                                                             : "--no-strided-copies");
      specs.push_back(variant);
      names.push_back(mode);
    }
    // Each case holds a prefill and a decode arena of about `bytes`.
    const uint64_t arenas = 2 * specs.size();
    const bool beside = arenas * bytes <= settings.max_arena_bytes;
    if (!beside) {
      result.notes.push_back(absl::StrFormat(
          "%s: its contiguous baseline%s ran after it, not room by room beside it (%d arenas of "
          "%d bytes pass the %d-byte bound)",
          label, variants.empty() ? "" : " and variants", arenas, bytes, settings.max_arena_bytes));
    }
    absl::StatusOr<std::vector<KvCaseFigures>> figures =
        RunBeside(specs, names, options.rooms, beside);
    if (!figures.ok()) {
      return AddContext(figures.status(), absl::StrCat(label, " (logs: ", case_logs, ")"));
    }
    KvCaseResult row = Summarise((*figures)[0]);
    if (row.bytes != bytes) {
      return absl::InternalError(absl::StrFormat(
          "%s: the prefill sidecars reported %d bytes per room; the layout holds %d", label,
          row.bytes, bytes));
    }
    row.shape = c.preset.name;
    row.prefill_tp = c.tp.prefill;
    row.decode_tp = c.tp.decode;
    row.tokens = c.tokens;
    row.link = c.link;
    KvCaseResult base_row = Summarise((*figures)[1]);
    base_row.shape = "contiguous";
    base_row.tokens = c.tokens;
    base_row.link = c.link;
    base_row.mode = "contiguous";
    base_row.efficiency = base_row.gbps > 0 ? 1.0 : 0;
    row.efficiency = base_row.gbps > 0 ? row.gbps / base_row.gbps : 0;
    result.cases.push_back(base_row);
    for (size_t v = 0; v < variants.size(); ++v) {
      KvCaseResult variant = Summarise((*figures)[2 + v]);
      variant.shape = row.shape;
      variant.prefill_tp = row.prefill_tp;
      variant.decode_tp = row.decode_tp;
      variant.tokens = row.tokens;
      variant.link = row.link;
      variant.mode = variants[v];
      variant.efficiency = base_row.gbps > 0 ? variant.gbps / base_row.gbps : 0;
      if (variants[v] == "naive" && variant.gbps > 0) row.naive_gain = row.gbps / variant.gbps;
      result.cases.push_back(variant);
    }
    if (options.layerwise) {
      // After the model's rooms: the same rooms streamed layer by layer, behind a simulated
      // forward pass whose compute per layer is one layer's share of their transfer time.
      const double share = row.bytes > 0 && row.gbps > 0
                               ? static_cast<double>(row.bytes) / (row.gbps * 1e9) /
                                     static_cast<double>(c.preset.shape.layers)
                               : 0;
      KvCaseSpec layered = spec;
      layered.layer_step = 1;
      layered.layer_compute = absl::Seconds(share * options.layer_compute_scale);
      absl::StatusOr<std::vector<KvCaseFigures>> streamed =
          RunBeside({layered}, {"layerwise"}, options.rooms, false);
      if (!streamed.ok()) {
        return AddContext(streamed.status(), absl::StrCat(label, " (logs: ", case_logs, ")"));
      }
      KvCaseResult lw = Summarise((*streamed)[0]);
      lw.shape = row.shape;
      lw.prefill_tp = row.prefill_tp;
      lw.decode_tp = row.decode_tp;
      lw.tokens = row.tokens;
      lw.link = row.link;
      lw.mode = "layerwise";
      lw.efficiency = base_row.gbps > 0 ? lw.gbps / base_row.gbps : 0;
      std::vector<double> exposed;
      const std::vector<KvRoomFigures>& rooms = (*streamed)[0].rooms;
      for (size_t r = rooms.size() > 1 ? 1 : 0; r < rooms.size(); ++r) {
        exposed.push_back(rooms[r].exposed_seconds * 1e3);
      }
      lw.exposed_ms = Percentile(exposed, 0.5);
      lw.layer_share_ms = share * 1e3;
      lw.layer_compute_scale = options.layer_compute_scale;
      lw.exposed_ratio = share > 0 ? lw.exposed_ms / lw.layer_share_ms : -1;
      result.cases.push_back(lw);
    }
    result.cases.push_back(row);
  }
  bar.Show(cases.size(), "done");
  // The sidecars' logs matter when a case fails (the error names the directory); a directory
  // this run made is removed once every case has passed.
  if (settings.log_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(log_dir, ignored);
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace kvrail::bench
