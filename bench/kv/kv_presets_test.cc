#include "bench/kv/kv_presets.h"

#include <gtest/gtest.h>

#include "control/layout/kv_shape.h"

namespace kvrail::bench {
namespace {

TEST(KvPresetsTest, Llama8bHoldsItsKvPerToken) {
  const KvPreset preset = FindKvPreset("llama3-8b").value();
  // 32 layers x (K + V) x 8 heads x 128 dims x 2 bytes = 128 KiB per token, at any TP.
  EXPECT_EQ(KvRoomBytes(preset.shape, 1, 4096), int64_t{4096} * 128 * 1024);
  EXPECT_EQ(KvRoomBytes(preset.shape, 2, 4096), int64_t{4096} * 128 * 1024);
  EXPECT_EQ(KvRoomPages(preset.shape, 4096), 256);
  EXPECT_EQ(KvRoomPages(preset.shape, 4097), 257);
}

TEST(KvPresetsTest, Llama70bSplitsItsEightHeadsUpToTp8) {
  const KvPreset preset = FindKvPreset("llama3-70b").value();
  EXPECT_EQ(preset.shape.layers, 80);
  for (int tp : {1, 2, 4, 8}) EXPECT_TRUE(KvShapeSplits(preset.shape, tp)) << tp;
  EXPECT_FALSE(KvShapeSplits(preset.shape, 3));
  // Each of 4 ranks holds 2 heads: the contract builder agrees.
  layout::KvShape shape = preset.shape;
  shape.pages = 4;
  EXPECT_TRUE(layout::BuildKvContract(shape, 4).ok());
  EXPECT_EQ(layout::FieldPageBytes(shape, 4), 16 * 2 * 128 * 2);
}

TEST(KvPresetsTest, MlaIsOneReplicatedLatentPerLayer) {
  const KvPreset preset = FindKvPreset("deepseek-v3-mla").value();
  EXPECT_TRUE(preset.shape.latent);
  EXPECT_EQ(preset.shape.latent_dim, 512 + 64);
  EXPECT_EQ(preset.shape.layers, 61);
  // Replicated: every rank of a TP-2 side holds the whole latent.
  EXPECT_EQ(KvRoomBytes(preset.shape, 2, 16), 2 * KvRoomBytes(preset.shape, 1, 16));
  EXPECT_TRUE(KvShapeSplits(preset.shape, 8));
}

// The window keeps the last 4096 tokens of a longer prompt; the state sends one snapshot.
TEST(KvPresetsTest, TheHybridSendsItsWindowAndOneStateSnapshot) {
  const KvPreset preset = FindKvPreset("hybrid-swa-state").value();
  // Per token: 16 attention layers x (K + V) x 8 heads x 128 dims x 2 bytes = 64 KiB; per room:
  // 16 states of 8 x 64 x 128 x 2 bytes = 128 KiB each.
  const int64_t state = 16 * 8 * 64 * 128 * 2;
  EXPECT_EQ(KvRoomBytes(preset.shape, 1, 4096), int64_t{4096} * 64 * 1024 + state);
  EXPECT_EQ(KvRoomBytes(preset.shape, 2, 4096), KvRoomBytes(preset.shape, 1, 4096));
  // At 8k tokens the window holds 4096 tokens: 256 pages, or 257 when it starts mid-page.
  const int64_t long_room = KvRoomBytes(preset.shape, 1, 8192) - state;
  EXPECT_GE(long_room, int64_t{4096} * 64 * 1024);
  EXPECT_LE(long_room, int64_t{4112} * 64 * 1024);
}

TEST(KvPresetsTest, UnknownPresetsAreRefusedNamingTheKnownOnes) {
  const absl::Status unknown = FindKvPreset("gpt-9").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("llama3-8b, llama3-70b, deepseek-v3-mla, hybrid-swa-state"),
            std::string::npos)
      << unknown;
}

}  // namespace
}  // namespace kvrail::bench
