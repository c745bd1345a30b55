// The copy into landing memory (engine/transport/landing_copy.h) with streaming stores against
// memcpy (its plain stores), like for like: the same thread, source, destination and rows, in
// the same run; which is faster on a host decides its --landing-stores. Rows as the data plane
// makes them: 1 KiB rows of a head-sliced room into every other KiB of the destination pages (P=2
// -> D=1), 8 KiB messages' and 64 KiB segments' payloads, and 4 MiB slices; 512 MiB of source into
// a 1 GiB destination that no cache holds.
//
//   bazel run -c opt //bench:landing_copy_bench
// Google Benchmark's table gives bytes_per_second per row size for both; the ratio
// streaming / memcpy is what streaming stores gain on this host (below 1: plain is faster).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "engine/transport/landing_copy.h"

namespace kvrail::bench {
namespace {

constexpr size_t kSource = size_t{512} << 20;

struct Buffers {
  std::byte* source;
  std::byte* destination;  // twice the source: rows go to every other row of it
};

const Buffers& Memory() {
  static const Buffers buffers = [] {
    auto map = [](size_t bytes) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
      return static_cast<std::byte*>(p == MAP_FAILED ? nullptr : p);
    };
    Buffers b{map(kSource), map(2 * kSource)};
    if (b.source != nullptr) std::memset(b.source, 1, kSource);
    if (b.destination != nullptr) std::memset(b.destination, 0, 2 * kSource);
    return b;
  }();
  return buffers;
}

template <bool kLanding>
void BM_Rows(benchmark::State& state) {
  const Buffers& m = Memory();
  if (m.source == nullptr || m.destination == nullptr) {
    state.SkipWithError("mmap of 1.5 GiB failed");
    return;
  }
  const size_t row = static_cast<size_t>(state.range(0));
  const size_t rows = kSource / row;
  for (auto _ : state) {
    for (size_t i = 0; i < rows; ++i) {
      std::byte* to = m.destination + 2 * i * row;
      const std::byte* from = m.source + i * row;
      if constexpr (kLanding) {
        transport::LandingCopy(to, from, row, transport::LandingStores::kStreaming);
      } else {
        std::memcpy(to, from, row);
      }
    }
    if constexpr (kLanding) transport::LandingFence();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kSource));
}

// A head-sliced row, a packed message, a tcp segment, a slice.
void RowSizes(benchmark::internal::Benchmark* b) {
  for (int64_t row : {1024, 8192, 65536, 4 << 20}) b->Arg(row);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_TEMPLATE(BM_Rows, false)->Name("memcpy/row_bytes")->Apply(RowSizes);
BENCHMARK_TEMPLATE(BM_Rows, true)->Name("streaming/row_bytes")->Apply(RowSizes);

}  // namespace
}  // namespace kvrail::bench

BENCHMARK_MAIN();
