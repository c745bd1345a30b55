#include "bench/kv/kv_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/layout/manifest.h"

namespace kvrail::bench {
namespace {

layout::KvShape Gqa(int layers, int kv_heads, int head_dim) {
  layout::KvShape shape;
  shape.layers = layers;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.dtype = layout::DType::kBfloat16;
  shape.page_tokens = 16;
  shape.prefix_granularity = 16;
  return shape;
}

// Even layers: sliding-window attention; odd layers: one recurrent state per room.
layout::KvShape Hybrid(int layers, int kv_heads, int head_dim, int window, int state_dim) {
  layout::KvShape shape = Gqa(layers, kv_heads, head_dim);
  shape.sliding_window_tokens = window;
  shape.state_dim = state_dim;
  return shape;
}

layout::KvShape Mla(int layers, int latent_dim) {
  layout::KvShape shape = Gqa(layers, 1, 1);
  shape.latent = true;
  shape.latent_dim = latent_dim;
  return shape;
}

}  // namespace

const std::vector<KvPreset>& KvPresets() {
  static const std::vector<KvPreset>* presets = new std::vector<KvPreset>{
      {"llama3-8b", "Llama-3-8B-like: 32 layers, 8 KV heads x 128, bf16, 16-token pages",
       Gqa(32, 8, 128)},
      {"llama3-70b", "Llama-3-70B-like: 80 layers, 8 KV heads x 128, bf16, 16-token pages",
       Gqa(80, 8, 128)},
      // 512 latent + 64 rope dims in one field per layer, as DeepSeek-V3's MLA cache holds them.
      {"deepseek-v3-mla",
       "DeepSeek-V3-like MLA: 61 layers, one 576-dim latent (512 + 64 rope), bf16, replicated",
       Mla(61, 576)},
      // Two cache groups with other rules (CACHEPD §5.2): the window keeps the last 4096
      // tokens of a longer prompt, and the state group sends one snapshot per room.
      {"hybrid-swa-state",
       "hybrid: 32 layers, even ones sliding-window attention (8 KV heads x 128, 4096-token "
       "window), odd ones a recurrent state (8 heads x 64 x 128), bf16, 16-token pages",
       Hybrid(32, 8, 128, 4096, 64)},
  };
  return *presets;
}

absl::StatusOr<KvPreset> FindKvPreset(absl::string_view name) {
  std::vector<std::string> names;
  for (const KvPreset& preset : KvPresets()) {
    if (preset.name == name) return preset;
    names.push_back(preset.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--presets: \"", name, "\": expected one of ", absl::StrJoin(names, ", ")));
}

int64_t KvRoomPages(const layout::KvShape& shape, int64_t tokens) {
  return (tokens + shape.page_tokens - 1) / shape.page_tokens;
}

bool KvShapeSplits(const layout::KvShape& shape, int tp) {
  return tp >= 1 && (shape.latent || shape.kv_heads % tp == 0);
}

int64_t KvRoomBytes(const layout::KvShape& shape, int tp, int64_t tokens) {
  layout::KvShape room = shape;
  room.pages = KvRoomPages(shape, tokens);
  absl::StatusOr<layout::Contract> contract = layout::BuildKvContract(room, tp);
  if (!contract.ok()) return 0;
  // Each field: the pages of its group's slots for the prompt (§5.2), on every rank.
  int64_t bytes = 0;
  for (const layout::FieldLayout& field : contract->plan.fields) {
    const layout::GroupSpec* spec = contract->FindGroupSpec(field.group_id);
    bytes += layout::LogicalSlots(*spec, 0, tokens).size() * field.page_stride_bytes;
  }
  return bytes * tp;
}

}  // namespace kvrail::bench
