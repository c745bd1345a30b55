// The model-shaped KV layouts of `kvrail bench kv`: each a layout::KvShape with the model's
// global KV heads, cut per rank by BuildKvContract at each side's TP size (a rank holds
// kv_heads / tp heads of every layer; an MLA latent is replicated on every rank).
#ifndef KVRAIL_BENCH_KV_KV_PRESETS_H_
#define KVRAIL_BENCH_KV_KV_PRESETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"

namespace kvrail::bench {

struct KvPreset {
  std::string name;         // "llama3-8b", the --presets word
  std::string description;  // for the table's header
  layout::KvShape shape;    // pages: set per case (KvPresetContract)
};

// llama3-8b, llama3-70b, deepseek-v3-mla, hybrid-swa-state, in that order.
const std::vector<KvPreset>& KvPresets();

// The preset called `name`. InvalidArgument listing the presets otherwise.
absl::StatusOr<KvPreset> FindKvPreset(absl::string_view name);

// Pages one room of `tokens` tokens fills: ceil(tokens / page_tokens).
int64_t KvRoomPages(const layout::KvShape& shape, int64_t tokens);

// Whether `shape` splits over attention TP `tp` (its KV heads divide evenly; a latent always
// does).
bool KvShapeSplits(const layout::KvShape& shape, int tp);

// Bytes one room of `tokens` tokens holds on all `tp` ranks of a side together (the latent
// counted on every rank that holds it): each field's pages of its group's slots (a sliding
// window keeps its last tokens, a state group one snapshot). 0 when the shape does not split
// over `tp`.
int64_t KvRoomBytes(const layout::KvShape& shape, int tp, int64_t tokens);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_PRESETS_H_
