#include "control/layout/peer_messages.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/base/error.h"
#include "tests/support/vectors.h"

namespace kvrail::layout {
namespace {

using kvrail::testing::LoadVectors;

// Every registration vector with the real contract parser behind frame 5: the outcome, the
// error category and every parsed member match the reference.
TEST(PeerMessagesVectorsTest, RegistrationsMatchTheReference) {
  const nlohmann::json vectors = LoadVectors("frames.json");
  for (const auto& entry : vectors["registration"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    if (entry["result"]["handler_path"] != "registration") continue;
    absl::StatusOr<DecodedRegistration> decoded =
        DecodeRegistration(kvrail::testing::VectorFrames(entry));
    const auto& parse = entry["result"]["parse"];
    if (!parse["ok"].get<bool>()) {
      ASSERT_FALSE(decoded.ok());
      const bool contract_error = parse["error"]["class"] == "CacheContractError";
      EXPECT_EQ(CategoryOf(decoded.status()),
                contract_error ? ErrorCategory::kInvalidContract : ErrorCategory::kInvalidFrame)
          << decoded.status();
      continue;
    }
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->frames.endpoint, parse["endpoint"].get<std::string>());
    EXPECT_EQ(decoded->frames.port, parse["dst_port"].get<int>());
    EXPECT_EQ(decoded->frames.session_id, parse["session_id"].get<std::string>());
    EXPECT_EQ(decoded->frames.arena_base, parse["dst_kv_ptr"].get<uint64_t>());
    EXPECT_EQ(decoded->frames.decode_tp_size, parse["decode_tp_size"].get<uint32_t>());
    EXPECT_EQ(decoded->frames.decode_tp_rank, parse["decode_tp_rank"].get<uint32_t>());
    EXPECT_EQ(*SerializeContract(decoded->contract),
              parse["contract_canonical_wire"].get<std::string>());
  }
}

TEST(PeerMessagesVectorsTest, PreallocationsMatchTheReference) {
  const nlohmann::json vectors = LoadVectors("frames.json");
  for (const auto& entry : vectors["preallocation"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    absl::StatusOr<DecodedPreallocation> decoded =
        DecodePreallocation(kvrail::testing::VectorFrames(entry));
    const auto& parse = entry["result"]["parse"];
    if (!parse["ok"].get<bool>()) {
      ASSERT_FALSE(decoded.ok());
      const bool frame_error =
          parse["error"]["message"].get<std::string>().rfind("CachePD", 0) == 0;
      EXPECT_EQ(CategoryOf(decoded.status()),
                frame_error ? ErrorCategory::kInvalidFrame : ErrorCategory::kInvalidManifest)
          << decoded.status();
      continue;
    }
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->frames.room, parse["room"].get<uint64_t>());
    EXPECT_EQ(decoded->frames.session_id, parse["session_id"].get<std::string>());
    EXPECT_EQ(decoded->frames.is_dummy(), parse["is_dummy"].get<bool>());
    if (!parse["manifest_canonical_wire"].is_null()) {
      ASSERT_TRUE(decoded->manifest.has_value());
      EXPECT_EQ(*SerializeManifest(*decoded->manifest),
                parse["manifest_canonical_wire"].get<std::string>());
    }
  }
}

TEST(PeerMessagesTest, ContractErrorsComeBeforeThePointerCheck) {
  const nlohmann::json vectors = LoadVectors("frames.json");
  std::vector<std::string> frames = kvrail::testing::VectorFrames(vectors["registration"][0]);
  frames[4] = std::string(8, '\0');  // pointer zero
  frames[5] = "{}";                  // and a bad contract
  absl::StatusOr<DecodedRegistration> decoded = DecodeRegistration(frames);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(CategoryOf(decoded.status()), ErrorCategory::kInvalidContract);
}

// The arena the prefill writes into, [base, base + ArenaBytes), must be one an address can
// hold: a base whose arena would pass 2^64 is refused, one that ends exactly there is not.
TEST(PeerMessagesTest, AnArenaThatPassesTwoToTheSixtyFourIsRefused) {
  const nlohmann::json vectors = LoadVectors("frames.json");
  std::vector<std::string> frames = kvrail::testing::VectorFrames(vectors["registration"][0]);
  absl::StatusOr<DecodedRegistration> decoded = DecodeRegistration(frames);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const uint64_t arena = static_cast<uint64_t>(decoded->contract.ArenaBytes());
  auto with_base = [&frames](uint64_t base) {
    std::vector<std::string> out = frames;
    for (int i = 0; i < 8; ++i) out[4][i] = static_cast<char>(base >> (8 * i));
    return DecodeRegistration(out);
  };
  EXPECT_TRUE(with_base(0 - arena).ok());
  for (uint64_t base : {0 - arena + 1, ~uint64_t{0}}) {
    absl::StatusOr<DecodedRegistration> refused = with_base(base);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(CategoryOf(refused.status()), ErrorCategory::kInvalidFrame);
    EXPECT_NE(refused.status().message().find("passes 2^64"), absl::string_view::npos)
        << refused.status();
  }
}

}  // namespace
}  // namespace kvrail::layout
