// The flags of `kvrail bench kv` and the sweep they select: which presets, TP pairs, prompt
// lengths and links, and how many rooms per case. Each parser names its flag and the rule
// a bad value broke, in one line.
#ifndef KVRAIL_BENCH_KV_KV_FLAGS_H_
#define KVRAIL_BENCH_KV_KV_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::bench {

struct TpPair {
  int prefill = 1;
  int decode = 1;
};
bool operator==(const TpPair& a, const TpPair& b);

// What the command line says, as given (empty: the sweep's default).
struct KvFlagText {
  std::string presets;
  std::string tp;
  std::string tokens;
  std::string links;
  int rooms = 0;  // 0: the sweep's default
  int sample_every = 16;
  bool quick = false;
  bool full = false;
  bool naive = false;
  bool digest = false;
  bool unpopulated = false;
  bool compare = false;
  bool streaming_stores = false;
  bool layerwise = false;
  double layer_compute_scale = 1;
};

struct KvBenchOptions {
  std::vector<std::string> presets;
  std::vector<TpPair> tp_pairs;
  std::vector<int64_t> tokens;
  std::vector<std::string> links;  // "tcp", "shm", "netns"
  int rooms = 0;                   // per case, the first on a fresh connection
  // After a case's first room (checked whole), every room checks manifest positions
  // room % sample_every, + sample_every, ... of every field.
  int sample_every = 16;
  // Each case also runs with the prefill sidecars' --naive-copies (one write per row per page
  // per field, never merged), beside it: a row of mode "naive", and the case's gain over it.
  bool naive = false;
  // Each case also runs with --verify-digest on every sidecar (docs/SECURITY.md, "Digests"),
  // beside it: a row of mode "digest", whose p50 and GB/s against the case's are its cost.
  bool digest = false;
  // Each case also runs with --no-populate-arena on every sidecar, beside it: a row of mode
  // "unpopulated", whose first room's GB/s against the case's is what populating saves.
  bool unpopulated = false;
  // Each case also runs with --no-strided-copies on every sidecar (each head-sliced row its own
  // copy, as before strided copies: docs/decisions/0016), beside it: a row of mode "rows". Under
  // --landing-stores auto each such row is a copy of its own and stores plainly, where the
  // case's strided rows stream (decisions 0018, 0019): the two differ in that too.
  bool compare = false;
  // Each case also runs with --landing-stores streaming on every sidecar (non-temporal stores
  // where the lanes land bytes, whole slices and single copies too: docs/decisions/0018, 0019),
  // beside it: a row of mode "streaming".
  bool streaming_stores = false;
  // Each case also runs layer-wise (engine API LayersReady, CACHEPD §6.11) after its model
  // rooms: a simulated forward pass whose compute per layer equals one layer's share of the
  // model rooms' measured transfer time, a LayersReady per layer, then the Ready. A row of mode
  // "layerwise" gives the transfer time still exposed after the last layer against that share.
  bool layerwise = false;
  // The simulated compute per layer, in layer shares (0.25 to 16): 1 is the measure
  // (compute exactly as fast as the transfer, so any shortfall of a layer's transfer queues up);
  // more leaves the lanes slack between layers, so what stays exposed is the last layer's
  // transfer and the fixed path to the decode's event.
  double layer_compute_scale = 1;
};

// The sweeps: --quick (llama3-8b, 1:1 and 2:1, 4k tokens, tcp and shm, 6 rooms), the default
// (four presets, 1:1 2:1 1:2 4:2 2:4, 1k to 32k tokens, tcp and shm, 5 rooms), and --full
// (the default plus 8:2 and 2:8, and netns).
KvBenchOptions QuickKvSweep();
KvBenchOptions DefaultKvSweep();
KvBenchOptions FullKvSweep();

// "1:1,2:1": TP sizes 1 to 8 on each side.
absl::StatusOr<std::vector<TpPair>> ParseTpPairs(absl::string_view text);
// "1k,4k,32768": 16 to 131072 tokens each (k = 1024).
absl::StatusOr<std::vector<int64_t>> ParseTokens(absl::string_view text);
// "tcp,shm,netns".
absl::StatusOr<std::vector<std::string>> ParseKvLinks(absl::string_view text);
// "llama3-8b,deepseek-v3-mla": names of KvPresets().
absl::StatusOr<std::vector<std::string>> ParsePresets(absl::string_view text);

// The sweep `text` selects: --quick or --full (not both), each list overriding the sweep's own.
absl::StatusOr<KvBenchOptions> ParseKvFlags(const KvFlagText& text);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_FLAGS_H_
