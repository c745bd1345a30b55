// What this host's memory gives rows that land apart, against the same bytes landing whole: the
// floor under a head-sliced room over shared memory, where each prefill rank's lanes store its
// heads' slice of every token row into the decode's pages, and the ranks' slices interleave.
//
//   bazel run -c opt //bench:row_landing_bench
//
// Each case runs W threads (W writers share each destination row, as W prefill ranks do) through
// the data plane's own LandingCopyRows, each thread copying its own 256 MiB / W of source, with
// plain stores and streaming ones (--landing-stores; auto, the default, streams these rows). Source
// and destination are shared memory (as a sidecar's arena and a peer's mapped segment are), written
// once before the runs (no first-touch faults), and no cache's:
//   - apart/row_bytes:R/writers:W: thread w stores row r at slot w of a W-row stride (1 KiB rows
//     of 2 writers are a 2:1 room's; 512 B of 2 are 4:2's; 256 B of 4 are 8:2's);
//   - read_apart/...: the same threads, rows and bytes the other way round: thread w reads its
//     slice of every W-row source row (as a prefill rank of the smaller TP reads each decode
//     rank's heads of its rows: 1:2's KiB of every 2 KiB is 1 KiB rows of 2 writers) and stores
//     them back to back in a part of its own (auto streams these too: decision 0019);
//   - read_paired/...: the same rows and bytes, but thread w takes stretches of 256 source rows
//     and reads each slice of a stretch in turn, storing it where read_apart's thread of that
//     slice does (what a tcp lane could do packing each rank's message of the same rows one after
//     the other: BENCHMARKS.md, "A source row read once for every decode rank");
//   - read_once/...: the same rows and bytes, but thread w reads whole source rows, its share of
//     them, and stores slice k of each row where read_apart's thread k stores it, row after row:
//     each source row read once, as a lane's shared pass reads it (decision 0020);
//   - gathered/...: the same rows, destination and threads, but each thread stores a part of the
//     destination's rows whole, reading each writer's slice of a row from that writer's source
//     part (what one writer per destination row would get: a design that is not built);
//   - back_to_back/...: the same threads, rows and bytes, each thread's rows one after another in
//     a part of its own (the rows alone, without the stride);
//   - whole/...: the same threads and bytes, each thread's part in 4 MiB slices, as a lane lands a
//     contiguous room (the baseline of `kvrail bench kv`'s efficiency). Plain slices are cached
//     stores: glibc streams only copies above its x86_non_temporal_threshold (127 MiB on the
//     project's VM: `ld.so --list-tunables`).
// bytes_per_second is all W writers' bytes over the wall time from their start to the last one's
// end; after the table, the bench prints each landing's best over whole's best, per shape.
// apart / whole is what any writer of such rows gets here against a contiguous room,
// whatever carries them (BENCHMARKS.md, "Rows that land apart, on this host's memory"). Add
// --benchmark_repetitions=3 for spread; the cases of a shape run one after another. The console
// table is the bench's own (it adds the ratios), so --benchmark_format does not change it: for
// JSON, add --benchmark_out=FILE --benchmark_out_format=json.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/transport/landing_copy.h"

namespace kvrail::bench {
namespace {

constexpr size_t kBytes = size_t{256} << 20;
constexpr size_t kSlice = size_t{4} << 20;

enum class Landing { kApart, kReadApart, kReadPaired, kReadOnce, kGathered, kBackToBack, kWhole };

const char* LandingName(Landing landing) {
  switch (landing) {
    case Landing::kApart:
      return "apart";
    case Landing::kReadApart:
      return "read_apart";
    case Landing::kReadPaired:
      return "read_paired";
    case Landing::kReadOnce:
      return "read_once";
    case Landing::kGathered:
      return "gathered";
    case Landing::kBackToBack:
      return "back_to_back";
    case Landing::kWhole:
      return "whole";
  }
  return "?";
}

struct Buffers {
  std::byte* source;       // kBytes: thread w copies [w * kBytes / W, (w + 1) * kBytes / W)
  std::byte* destination;  // kBytes
};

const Buffers& Memory() {
  static const Buffers buffers = [] {
    auto map = [](size_t bytes, int fill) -> std::byte* {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      std::memset(p, fill, bytes);
      return static_cast<std::byte*>(p);
    };
    return Buffers{map(kBytes, 1), map(kBytes, 0)};
  }();
  return buffers;
}

// One iteration: `writers` threads each copy their part once; the iteration's time runs from the
// threads' start to the last one's end (manual time).
void BM_Land(benchmark::State& state, Landing landing, size_t row, size_t writers,
             transport::LandingStores stores) {
  const Buffers& m = Memory();
  if (m.source == nullptr || m.destination == nullptr) {
    state.SkipWithError("mmap of 512 MiB failed");
    return;
  }
  const size_t part = kBytes / writers;
  auto write = [&](size_t w) {
    const std::byte* from = m.source + w * part;
    switch (landing) {
      case Landing::kApart:
        transport::LandingCopyRows(m.destination + w * row, writers * row, from, row, row,
                                   part / row, stores);
        break;
      case Landing::kReadApart:
        // Thread w's rows are its slice of every W-row source row, stored back to back.
        transport::LandingCopyRows(m.destination + w * part, row, m.source + w * row, writers * row,
                                   row, part / row, stores);
        break;
      case Landing::kReadPaired:
        // Thread w takes stretches of 256 source rows (every W-th one), and reads each slice of
        // a stretch in turn, storing it where read_apart's thread of that slice stores it.
        for (size_t first = w * 256; first < part / row; first += writers * 256) {
          const size_t n = std::min<size_t>(256, part / row - first);
          for (size_t k = 0; k < writers; ++k) {
            transport::LandingCopyRows(m.destination + k * part + first * row, row,
                                       m.source + first * writers * row + k * row, writers * row,
                                       row, n, stores);
          }
        }
        break;
      case Landing::kReadOnce:
        // Thread w reads whole source rows, its share of them, and stores slice k of each row
        // into part k, row after row: read_apart's landing with each source row read once.
        for (size_t r = w * (part / row / writers); r < (w + 1) * (part / row / writers); ++r) {
          transport::LandingCopyRows(m.destination + r * row, part, m.source + r * writers * row,
                                     row, row, writers, stores);
        }
        break;
      case Landing::kGathered:
        // Thread w stores whole destination rows (W slices each), its share of them: row r
        // takes slice k from row r of source part k, for every k in turn.
        for (size_t r = w * (part / row / writers); r < (w + 1) * (part / row / writers); ++r) {
          transport::LandingCopyRows(m.destination + r * writers * row, row, m.source + r * row,
                                     part, row, writers, stores);
        }
        break;
      case Landing::kBackToBack:
        transport::LandingCopyRows(m.destination + w * part, row, from, row, row, part / row,
                                   stores);
        break;
      case Landing::kWhole:
        transport::LandingCopyRows(m.destination + w * part, kSlice, from, kSlice, kSlice,
                                   part / kSlice, stores);
        break;
    }
    transport::LandingFence();
  };
  std::vector<std::thread> threads;
  threads.reserve(writers);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t w = 0; w < writers; ++w) threads.emplace_back(write, w);
    for (std::thread& t : threads) t.join();
    threads.clear();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.SetLabel(transport::LandingStoresName(stores));
}

// A 2:1 room's rows, 4:2's and 8:2's (llama3-8b: 128-dimension bf16 heads, 8 KV heads), with
// both store kinds; a shape's cases registered one after another, so that a host whose speed
// drifts moves them alike.
void Register() {
  for (auto [row, writers] : {std::pair{1024, 2}, std::pair{512, 2}, std::pair{256, 4}}) {
    for (Landing landing :
         {Landing::kApart, Landing::kReadApart, Landing::kReadPaired, Landing::kReadOnce,
          Landing::kGathered, Landing::kBackToBack, Landing::kWhole}) {
      for (transport::LandingStores stores : transport::kLandingStoreKinds) {
        const std::string name =
            absl::StrFormat("%s/row_bytes:%d/writers:%d", LandingName(landing), row, writers);
        benchmark::RegisterBenchmark(name.c_str(), &BM_Land, landing, static_cast<size_t>(row),
                                     static_cast<size_t>(writers), stores)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime()
            ->MinTime(1.0);
      }
    }
  }
}

// The console's table, then per shape the best rate of each landing over the best of whole (any
// store kind, any repetition): the figures BENCHMARKS.md quotes, so nobody divides by hand.
class FloorReporter : public benchmark::ConsoleReporter {
 public:
  // Colour on a terminal only, as Google Benchmark's own console does by default.
  FloorReporter() : ConsoleReporter(isatty(STDOUT_FILENO) != 0 ? OO_Color : OO_None) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      const auto rate = run.counters.find("bytes_per_second");
      if (rate == run.counters.end()) continue;
      // "apart/row_bytes:1024/writers:2/min_time:1.000/manual_time": the landing, then the shape.
      const std::vector<std::string> parts = absl::StrSplit(run.benchmark_name(), '/');
      if (parts.size() < 3) continue;
      const std::string shape = absl::StrCat(parts[1], "/", parts[2]);
      if (std::find(shapes_.begin(), shapes_.end(), shape) == shapes_.end()) {
        shapes_.push_back(shape);
      }
      double& best = best_[shape][parts[0]];
      best = std::max(best, static_cast<double>(rate->second));
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::string summary;  // a line per shape that ran whole and another landing
    for (const std::string& shape : shapes_) {
      const std::map<std::string, double>& best = best_[shape];
      const auto whole = best.find(LandingName(Landing::kWhole));
      if (whole == best.end() || whole->second <= 0) continue;
      std::string ratios;
      for (Landing landing : {Landing::kApart, Landing::kReadApart, Landing::kReadPaired,
                              Landing::kReadOnce, Landing::kGathered, Landing::kBackToBack}) {
        const auto it = best.find(LandingName(landing));
        if (it != best.end()) {
          absl::StrAppendFormat(&ratios, " %s %.2f", LandingName(landing),
                                it->second / whole->second);
        }
      }
      if (!ratios.empty()) absl::StrAppend(&summary, "  ", shape, ":", ratios, "\n");
    }
    if (summary.empty()) return;
    GetOutputStream() << "\nbest rate of each landing over the best of whole (either store kind):\n"
                      << summary;
  }

 private:
  std::vector<std::string> shapes_;                            // in the order they ran
  std::map<std::string, std::map<std::string, double>> best_;  // shape -> landing -> bytes/s
};

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kvrail::bench::Register();
  kvrail::bench::FloorReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
