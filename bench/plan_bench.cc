// Benchmarks of the route planner (CACHEPD §6) and send-time address resolution (§6.9) on a
// realistic model: 80 layers with K and V each, bfloat16 pages of [16 tokens, local KV heads,
// 128], 8 global KV heads split on axis 1, one full_suffix history group of 16-token pages.
// Prefill TP 16 holds max(8 / 16, 1) = 1 head per rank (k = 8 distinct shards, replica groups
// of R = 2, GQA replication); decode TP 8 holds 1 head per rank (k = 8, R = 1).
//
// The question: does resolving a room's copies cost a small fraction of moving its bytes? One
// prefill -> decode pair moves 160 fields * 2048 pages * 4 KiB = 1.34 GB for a 32768-token
// room, 26.8 ms at 400 Gb/s (50e9 B/s). The target: resolution (the batched cursor) < 5% of
// that wire time. After the benchmarks, a separately timed run prints the ratio and PASS/MISS.
//
//   bazel run -c opt //bench:plan_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/plan/route.h"

namespace kvrail::bench {
namespace {

constexpr int kLayers = 80;
constexpr int64_t kKvHeads = 8;
constexpr int64_t kHeadDim = 128;
constexpr int64_t kTokensPerPage = 16;
constexpr int kPrefillTp = 16;
constexpr int kDecodeTp = 8;
constexpr int64_t kRoomTokens = 32768;
constexpr int64_t kRoomBlocks = kRoomTokens / kTokensPerPage;  // 2048
constexpr double kWireBytesPerSecond = 50e9;                   // 400 Gb/s
constexpr double kTargetFraction = 0.05;

void Die(const absl::Status& status, const char* what) {
  if (status.ok()) {
    return;
  }
  std::fprintf(stderr, "plan_bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

// One rank's contract at TP `tp`: one paged tensor (plane) per layer and K/V, as engines that
// allocate a cache tensor per layer do, planes back to back in plane_id order, one cache block
// per LCM block, so page_stride == payload.
layout::Contract ModelContract(int tp, int64_t num_lcm_blocks) {
  const int64_t local_heads = std::max<int64_t>(kKvHeads / tp, 1);
  const int64_t page_bytes = kTokensPerPage * local_heads * kHeadDim * 2;  // bfloat16
  layout::Contract c;
  c.plan.prefix_granularity = kTokensPerPage;
  c.plan.num_lcm_blocks = num_lcm_blocks;
  c.plan.groups.push_back({"full", 1, 1 + num_lcm_blocks});
  layout::GroupSpec spec;
  spec.group_id = "full";
  spec.retention = layout::Retention::kFullHistory;
  spec.rows_per_page = kTokensPerPage;
  spec.entry_stride_tokens = 1;
  spec.family = "history";
  spec.transfer_policy = layout::TransferPolicy::kFullSuffix;
  c.group_specs.push_back(spec);
  int64_t plane_index = 0;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (const char* kv : {"k", "v"}) {
      const std::string field_id = absl::StrFormat("layer.%d.%s", layer, kv);
      const std::string plane_id = absl::StrFormat("plane.%03d.%s", layer, kv);
      c.plan.planes.push_back(
          {plane_id, page_bytes, plane_index * (num_lcm_blocks + 1) * page_bytes});
      ++plane_index;
      layout::FieldLayout field;
      field.group_id = "full";
      field.field_id = field_id;
      field.plane_id = plane_id;
      field.shape = {kTokensPerPage, local_heads, kHeadDim};
      field.dtype = layout::DType::kBfloat16;
      field.field_offset_bytes = 0;
      field.page_stride_bytes = page_bytes;
      c.plan.fields.push_back(field);
      c.transfer_schema.push_back({field_id, layout::Partition{1, kKvHeads, {}}});
    }
  }
  c.plan.lcm_block_bytes = plane_index * page_bytes;
  Die(layout::ValidateContract(c), "model contract");
  Die(layout::CheckArenaFits(c), "model contract arena");
  return c;
}

// A 32768-token room (prefix 0) on one side: 2048 block ids, shuffled or one consecutive run.
layout::Manifest Room(const layout::Contract& c, bool consecutive, uint64_t seed) {
  const int64_t pages = c.plan.groups[0].page_count;
  std::vector<int64_t> ids(pages - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937_64 rng(seed);
  if (consecutive) {
    const int64_t start = static_cast<int64_t>(rng() % (ids.size() - kRoomBlocks + 1));
    ids.erase(ids.begin(), ids.begin() + start);
  } else {
    std::shuffle(ids.begin(), ids.end(), rng);
  }
  ids.resize(kRoomBlocks);
  absl::StatusOr<layout::Manifest> m = layout::BuildManifest(c, {ids}, 0, kRoomTokens);
  Die(m.status(), "room manifest");
  return *std::move(m);
}

struct Model {
  layout::Contract prefill = ModelContract(kPrefillTp, 4096);
  // The decode's arena differs: its own capacity, hence its own plane offsets.
  layout::Contract decode = ModelContract(kDecodeTp, 3000);
};

const Model& GetModel() {
  static const Model* const model = [] {
    auto* m = new Model();
    Die(layout::CheckPeerContracts(m->prefill, m->decode), "peer check");
    return m;
  }();
  return *model;
}

// One (prefill rank, decode rank) send pair, bound once, with one room's manifests.
struct SendPair {
  int prefill_rank = 0;
  int decode_rank = 0;
  plan::CopyPlan plan;
  layout::Manifest src_room;
  layout::Manifest dst_room;
};

SendPair MakeSendPair(bool consecutive_pages) {
  const Model& m = GetModel();
  absl::StatusOr<plan::Planner> planner =
      plan::Planner::Create(kPrefillTp, kDecodeTp, m.prefill, m.decode);
  Die(planner.status(), "Planner::Create");
  const int d = 3;
  absl::StatusOr<plan::Route> route = planner->PlanForDecodeRank(d);
  Die(route.status(), "PlanForDecodeRank");
  const int p = route->sources.front().prefill_rank;
  plan::RegistrationOutcome outcome = planner->OnRegistration(p, d);
  Die(outcome.error, "OnRegistration");
  absl::StatusOr<plan::CopyPlan> bound =
      plan::CopyPlan::Bind(m.prefill, m.decode, outcome.fragments);
  Die(bound.status(), "CopyPlan::Bind");
  return SendPair{p, d, *std::move(bound), Room(m.prefill, consecutive_pages, 1),
                  Room(m.decode, consecutive_pages, 2)};
}

struct RoomResolution {
  size_t copies_before = 0;
  size_t copies_after = 0;
  uint64_t bytes = 0;
};

// The sender's batch: Mooncake posts at most 4096 descriptors per call (CACHEPD §6.9), and a
// batch of 4096 copies (96 KiB) stays in L2.
constexpr size_t kBatch = 4096;

// Resolves one room the way the sender does: a coalescing cursor fills a reused batch, which
// is consumed (here: its bytes summed, where the sender would post it) before the next.
// copies_before is what Expand alone would emit.
RoomResolution Resolve(const SendPair& pair, std::vector<Copy>& batch) {
  absl::StatusOr<plan::CopyCursor> cursor =
      pair.plan.Begin(pair.src_room, pair.dst_room, /*coalesce=*/true);
  Die(cursor.status(), "Begin");
  RoomResolution r;
  r.copies_before = static_cast<size_t>(pair.plan.CountCopies(pair.src_room));
  for (size_t n; (n = cursor->Next(batch.data(), batch.size())) > 0;) {
    r.copies_after += n;
    for (size_t i = 0; i < n; ++i) r.bytes += batch[i].length;
  }
  return r;
}

// (1) Everything a deployment plans once per registration: the planner, every decode rank's
// route, and every prefill rank's decision on every decode rank's registration.
void BM_PlanAllDecodeRanks(benchmark::State& state) {
  const Model& m = GetModel();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    absl::StatusOr<plan::Planner> planner =
        plan::Planner::Create(kPrefillTp, kDecodeTp, m.prefill, m.decode);
    if (!planner.ok()) {
      state.SkipWithError(planner.status().ToString().c_str());
      break;
    }
    for (int d = 0; d < kDecodeTp; ++d) {
      absl::StatusOr<plan::Route> route = planner->PlanForDecodeRank(d);
      benchmark::DoNotOptimize(route);
    }
    for (int p = 0; p < kPrefillTp; ++p) {
      for (int d = 0; d < kDecodeTp; ++d) {
        plan::RegistrationOutcome outcome = planner->OnRegistration(p, d);
        benchmark::DoNotOptimize(outcome);
      }
    }
  }
  state.counters["routes"] = kDecodeTp;
  state.counters["registrations"] = kPrefillTp * kDecodeTp;
}
BENCHMARK(BM_PlanAllDecodeRanks)->Unit(benchmark::kMicrosecond);

// (2) One 32768-token room of one send pair, resolved by the coalescing cursor in batches. The
// plan is bound once, outside the timed loop, as the prefill does per registration.
void BM_ResolveRoom32k(benchmark::State& state, bool consecutive_pages) {
  const SendPair pair = MakeSendPair(consecutive_pages);
  std::vector<Copy> batch(kBatch);
  const RoomResolution r = Resolve(pair, batch);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    RoomResolution again = Resolve(pair, batch);
    benchmark::DoNotOptimize(again);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double wire_seconds = static_cast<double>(r.bytes) / kWireBytesPerSecond;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(r.bytes));
  state.counters["copies_before"] = static_cast<double>(r.copies_before);
  state.counters["copies_after"] = static_cast<double>(r.copies_after);
  state.counters["room_bytes"] = static_cast<double>(r.bytes);
  state.counters["wire_ms"] = wire_seconds * 1e3;
  // 100 * (resolution time per room) / (room wire time at 400 Gb/s); the target is < 5.
  state.counters["pct_of_wire"] =
      100 * elapsed / static_cast<double>(std::max<int64_t>(state.iterations(), 1)) / wire_seconds;
}
BENCHMARK_CAPTURE(BM_ResolveRoom32k, random_pages, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ResolveRoom32k, consecutive_pages, true)->Unit(benchmark::kMillisecond);

// For comparison: materialising the whole uncoalesced list (Expand into a CopyList, 7.9 MB for
// this room), which costs DRAM bandwidth the batched cursor avoids.
void BM_ExpandRoom32k(benchmark::State& state, bool consecutive_pages) {
  const SendPair pair = MakeSendPair(consecutive_pages);
  CopyList copies;
  Die(pair.plan.Expand(pair.src_room, pair.dst_room, copies), "Expand");
  for (auto _ : state) {  // NOLINT(clang-analyzer-deadcode.DeadStores)
    copies.clear();
    Die(pair.plan.Expand(pair.src_room, pair.dst_room, copies), "Expand");
    benchmark::DoNotOptimize(copies.begin());
    benchmark::ClobberMemory();
  }
  state.counters["copies"] = static_cast<double>(copies.size());
}
BENCHMARK_CAPTURE(BM_ExpandRoom32k, random_pages, false)->Unit(benchmark::kMillisecond);

// The budget check, timed on its own with a steady clock: `rooms` rooms after a warm-up, each
// timed alone; the median (robust on a shared machine) against the room's wire time.
bool Summarize(const char* name, bool consecutive_pages, int rooms) {
  const SendPair pair = MakeSendPair(consecutive_pages);
  std::vector<Copy> batch(kBatch);
  RoomResolution r;
  for (int i = 0; i < 3; ++i) {
    r = Resolve(pair, batch);
  }
  std::vector<double> seconds;
  for (int i = 0; i < rooms; ++i) {
    const auto start = std::chrono::steady_clock::now();
    RoomResolution again = Resolve(pair, batch);
    benchmark::DoNotOptimize(again);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double wire = static_cast<double>(r.bytes) / kWireBytesPerSecond;
  const double ratio = median / wire;
  const bool pass = ratio < kTargetFraction;
  std::printf(
      "summary %-17s prefill rank %d -> decode rank %d: %zu copies -> %zu after coalescing, "
      "%llu bytes/room; resolution %.3f ms/room (median of %d, best %.3f), wire %.3f ms/room "
      "at 400 Gb/s: %.2f%% of wire time (target < %.0f%%) %s\n",
      name, pair.prefill_rank, pair.decode_rank, r.copies_before, r.copies_after,
      static_cast<unsigned long long>(r.bytes), median * 1e3, rooms, seconds.front() * 1e3,
      wire * 1e3, ratio * 100, kTargetFraction * 100, pass ? "PASS" : "MISS");
  return pass;
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const bool random_ok = kvrail::bench::Summarize("random_pages", false, 30);
  const bool consecutive_ok = kvrail::bench::Summarize("consecutive_pages", true, 30);
  std::printf("RESULT ResolveRoom32k resolution < 5%% of 400 Gb/s wire time: %s\n",
              random_ok && consecutive_ok ? "PASS" : "MISS");
  return 0;
}
