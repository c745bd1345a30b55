// What --verify-digest costs (docs/SECURITY.md, "Digests"): the room digest
// (control/plan/room_digest.h: sort by destination, then XXH3-64 over each copy's bytes) of a
// room-shaped copy list, against memcpy of the same copies in the same run, which is what a
// shared-memory write costs the CPU that makes it. Rooms of 64 MiB and 1 GiB, as whole-page
// copies of 1 MiB and as head-sliced rows of 1 KiB (destinations shuffled, so the sort does
// real work: the worst case; a last row has them in order, as a planner's list mostly is).
//
//   bazel run -c opt //bench:digest_bench
// After Google Benchmark's table, a separately timed run (median of 5) prints GB/s and the
// ratio digest / memcpy per case.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "control/plan/room_digest.h"

namespace kvrail::bench {
namespace {

struct Room {
  std::vector<uint8_t> source;
  std::vector<uint8_t> destination;
  CopyList copies;  // planner order: source ascending, destinations shuffled
};

Room MakeRoom(uint64_t bytes, uint64_t copy_bytes, bool shuffled) {
  Room room;
  room.source.resize(bytes);
  room.destination.resize(bytes);
  std::mt19937_64 random(1);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = random();
    std::memcpy(&room.source[i], &v, 8);
  }
  const uint64_t n = bytes / copy_bytes;
  std::vector<uint64_t> slots(n);
  std::iota(slots.begin(), slots.end(), 0);
  if (shuffled) std::shuffle(slots.begin(), slots.end(), random);
  for (uint64_t i = 0; i < n; ++i) {
    room.copies.push_back({i * copy_bytes, slots[i] * copy_bytes, copy_bytes});
  }
  return room;
}

// One room at a time: 1 GiB rooms are large.
Room& Cached(uint64_t bytes, uint64_t copy_bytes, bool shuffled = true) {
  static Room room;
  static uint64_t made_bytes = 0, made_copy = 0;
  static bool made_shuffled = false;
  if (made_bytes != bytes || made_copy != copy_bytes || made_shuffled != shuffled) {
    room = Room();
    room = MakeRoom(bytes, copy_bytes, shuffled);
    made_bytes = bytes;
    made_copy = copy_bytes;
    made_shuffled = shuffled;
  }
  return room;
}

uint64_t Digest(Room& room) {
  CopyList copies = room.copies;  // the prefill sorts a copy; the writes keep their order
  return plan::RoomDigest(copies, plan::DigestSide::kSource, room.source).value();
}

void Memcpy(Room& room) {
  for (const Copy& c : room.copies) {
    std::memcpy(room.destination.data() + c.dst_offset, room.source.data() + c.src_offset,
                c.length);
  }
  benchmark::ClobberMemory();
}

void BM_RoomDigest(benchmark::State& state) {
  Room& room = Cached(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(Digest(room));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  Room& room = Cached(state.range(0), state.range(1));
  for (auto _ : state) Memcpy(room);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

constexpr int64_t kMiB = 1 << 20;
#define ROOMS                         \
  Args({64 * kMiB, kMiB})             \
      ->Args({64 * kMiB, 1024})       \
      ->Args({1024 * kMiB, kMiB})     \
      ->Args({1024 * kMiB, 1024})     \
      ->Unit(benchmark::kMillisecond) \
      ->UseRealTime()
BENCHMARK(BM_RoomDigest)->ROOMS;
BENCHMARK(BM_Memcpy)->ROOMS;

template <typename F>
double MedianSeconds(F&& f) {
  std::vector<double> runs;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

void Summary() {
  std::printf("\n%-38s %12s %12s %8s\n", "room", "digest GB/s", "memcpy GB/s", "ratio");
  struct Case {
    int64_t bytes, copy;
    bool shuffled;
  };
  for (const Case& c : std::vector<Case>{{64 * kMiB, kMiB, true},
                                         {64 * kMiB, 1024, true},
                                         {1024 * kMiB, kMiB, true},
                                         {1024 * kMiB, 1024, true},
                                         {1024 * kMiB, 1024, false}}) {
    const int64_t bytes = c.bytes, copy = c.copy;
    Room& room = Cached(bytes, copy, c.shuffled);
    uint64_t sink = 0;
    const double digest = MedianSeconds([&] { sink ^= Digest(room); });
    const double copy_time = MedianSeconds([&] { Memcpy(room); });
    benchmark::DoNotOptimize(sink);
    char name[64];
    std::snprintf(name, sizeof(name), "%lld MiB as %lld x %lld B%s", (long long)(bytes / kMiB),
                  (long long)(bytes / copy), (long long)copy, c.shuffled ? "" : ", in order");
    std::printf("%-38s %12.2f %12.2f %8.2f\n", name, bytes / digest / 1e9, bytes / copy_time / 1e9,
                digest / copy_time);
  }
}

}  // namespace
}  // namespace kvrail::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  kvrail::bench::Summary();
  return 0;
}
