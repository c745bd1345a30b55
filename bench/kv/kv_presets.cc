#include "bench/kv/kv_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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
  };
  return *presets;
}

const std::vector<MissingKvPreset>& MissingKvPresets() {
  static const std::vector<MissingKvPreset>* missing = new std::vector<MissingKvPreset>{
      {"hybrid-swa-state",
       "a sliding-window plus state layout needs several cache groups (a sliding-window group "
       "and a state group with checkpoint geometry), and layout::BuildKvContract builds one "
       "full-history group only"},
  };
  return *missing;
}

absl::StatusOr<KvPreset> FindKvPreset(absl::string_view name) {
  std::vector<std::string> names;
  for (const KvPreset& preset : KvPresets()) {
    if (preset.name == name) return preset;
    names.push_back(preset.name);
  }
  for (const MissingKvPreset& missing : MissingKvPresets()) {
    if (missing.name == name) {
      return absl::InvalidArgumentError(
          absl::StrCat("--presets: \"", name, "\" is not available: ", missing.reason));
    }
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
  const int64_t fields = int64_t{shape.layers} * (shape.latent ? 1 : 2);
  return KvRoomPages(shape, tokens) * fields * layout::FieldPageBytes(shape, tp) * tp;
}

}  // namespace kvrail::bench
