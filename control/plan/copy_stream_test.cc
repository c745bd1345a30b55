#include "control/plan/copy_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/vector_cases.h"
#include "tests/support/vectors.h"

namespace kvrail::plan {
namespace {

using kvrail::testing::LoadVectors;

// Everything a stream yields, pulled `chunk` copies at a time.
std::vector<Copy> Drain(CopySource& source, size_t chunk) {
  std::vector<Copy> all, buffer(chunk);
  while (size_t n = source.Next(buffer.data(), chunk))
    all.insert(all.end(), buffer.begin(), buffer.begin() + n);
  EXPECT_EQ(source.Next(buffer.data(), chunk), 0u);  // and stays done
  return all;
}

// One case's plan and manifests, shared as a stream keeps them.
struct Room {
  std::shared_ptr<const CopyPlan> plan;
  std::shared_ptr<const layout::Manifest> src;
  std::shared_ptr<const layout::Manifest> dst;
};
Room LoadRoom(const nlohmann::json& c) {
  return {std::make_shared<const CopyPlan>(
              *CopyPlan::Bind(*layout::ParseContract(c["prefill_contract"].get<std::string>()),
                              *layout::ParseContract(c["decode_contract"].get<std::string>()),
                              testing::FragmentsFromJson(c["fragments"]))),
          std::make_shared<const layout::Manifest>(
              *layout::ParseManifest(c["src_manifest"].get<std::string>())),
          std::make_shared<const layout::Manifest>(
              *layout::ParseManifest(c["dst_manifest"].get<std::string>()))};
}

// Every case of descriptors.json: the stream yields exactly what Expand and ExpandCoalesced
// (or ExpandLayers, for a layer range) append, in their order, whatever the chunk size; its
// envelope holds every copy, with the exact bytes and the copies before merging.
TEST(CopyStreamTest, YieldsWhatExpandAppendsInsideItsEnvelope) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  int cases = 0, layered = 0;
  for (const auto& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto [plan, src, dst] = LoadRoom(c);
    std::vector<CopyPlan::LayerRange> ranges = {{}};
    if (plan->layered().ok()) {
      ranges.push_back({0, 1});
      ranges.push_back({1, INT64_MAX});
      ++layered;
    }
    for (const CopyPlan::LayerRange layers : ranges) {
      for (const bool coalesce : {false, true}) {
        CopyList want;
        if (layers.begin > 0 || layers.end != INT64_MAX) {
          ASSERT_TRUE(plan->ExpandLayers(*src, *dst, layers, coalesce, want).ok());
        } else if (coalesce) {
          ASSERT_TRUE(plan->ExpandCoalesced(*src, *dst, want).ok());
        } else {
          ASSERT_TRUE(plan->Expand(*src, *dst, want).ok());
        }
        for (const size_t chunk : {size_t{1}, size_t{7}, size_t{4096}}) {
          auto stream = StreamRoom(plan, src, dst, layers, coalesce);
          ASSERT_TRUE(stream.ok()) << stream.status();
          const CopyEnvelope e = (*stream)->envelope();
          const std::vector<Copy> got = Drain(**stream, chunk);
          ASSERT_TRUE(got == std::vector<Copy>(want.begin(), want.end())) << "chunk " << chunk;
          uint64_t bytes = 0;
          // The envelope is the copies' hull exactly, not merely around them.
          uint64_t src_begin = UINT64_MAX, src_end = 0, dst_begin = UINT64_MAX, dst_end = 0;
          for (const Copy& copy : got) {
            ASSERT_GE(copy.src_offset, e.src_begin);
            ASSERT_LE(copy.src_offset + copy.length, e.src_end);
            ASSERT_GE(copy.dst_offset, e.dst_begin);
            ASSERT_LE(copy.dst_offset + copy.length, e.dst_end);
            src_begin = std::min(src_begin, copy.src_offset);
            src_end = std::max(src_end, copy.src_offset + copy.length);
            dst_begin = std::min(dst_begin, copy.dst_offset);
            dst_end = std::max(dst_end, copy.dst_offset + copy.length);
            bytes += copy.length;
          }
          EXPECT_EQ(e.bytes, bytes);
          if (!got.empty()) {
            EXPECT_EQ(e.src_begin, src_begin);
            EXPECT_EQ(e.src_end, src_end);
            EXPECT_EQ(e.dst_begin, dst_begin);
            EXPECT_EQ(e.dst_end, dst_end);
          }
          if (!coalesce) {
            EXPECT_EQ(e.copies, got.size());
          }
          EXPECT_GE(e.copies, got.size());
        }
      }
    }
    ++cases;
  }
  EXPECT_GE(cases, 4);
  EXPECT_GE(layered, 1);
}

// Every case of descriptors.json, strided (issue 31): each page's rows of a row fragment come as
// one strided copy, and the rows of what the stream yields, merged, are ExpandCoalesced's list:
// the same bytes to the same places in the same order, whatever the chunk size. The envelope
// holds every copy's rows, with the exact bytes.
TEST(CopyStreamTest, AStridedStreamYieldsTheSameRowsAsWholePagesOfThem) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  int strided_cases = 0;
  for (const auto& c : vectors["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto [plan, src, dst] = LoadRoom(c);
    CopyList want;
    ASSERT_TRUE(plan->ExpandCoalesced(*src, *dst, want).ok());
    bool any_strided = false;
    for (const bool coalesce : {false, true}) {
      for (const size_t chunk : {size_t{1}, size_t{7}, size_t{4096}}) {
        auto stream = StreamRoom(plan, src, dst, {}, coalesce, /*strided=*/true);
        ASSERT_TRUE(stream.ok()) << stream.status();
        const CopyEnvelope e = (*stream)->envelope();
        const std::vector<Copy> got = Drain(**stream, chunk);
        CopyList rows;
        uint64_t bytes = 0;
        for (const Copy& copy : got) {
          any_strided |= copy.rows > 1;
          ASSERT_GE(copy.src_offset, e.src_begin);
          ASSERT_LE(copy.src_offset + SourceSpan(copy), e.src_end);
          ASSERT_GE(copy.dst_offset, e.dst_begin);
          ASSERT_LE(copy.dst_offset + DestinationSpan(copy), e.dst_end);
          bytes += PayloadBytes(copy);
          ForEachRow(copy, [&](uint64_t s, uint64_t d, uint64_t n) { rows.push_back({s, d, n}); });
        }
        EXPECT_EQ(e.bytes, bytes);
        EXPECT_GE(e.copies, got.size());
        Coalesce(rows);
        ASSERT_TRUE(rows == want) << "coalesce " << coalesce << ", chunk " << chunk;
      }
    }
    strided_cases += any_strided ? 1 : 0;
  }
  EXPECT_GE(strided_cases, 1);  // some case slices heads
}

// The room's errors come before any copy: a manifest that does not pair, and a layer range on
// a contract whose fields are not layer.<N>.*.
TEST(CopyStreamTest, RefusesWhatExpandRefuses) {
  const nlohmann::json vectors = LoadVectors("descriptors.json");
  for (const auto& c : vectors["cases"]) {
    auto plan = std::make_shared<const CopyPlan>(
        *CopyPlan::Bind(*layout::ParseContract(c["prefill_contract"].get<std::string>()),
                        *layout::ParseContract(c["decode_contract"].get<std::string>()),
                        testing::FragmentsFromJson(c["fragments"])));
    auto src = std::make_shared<const layout::Manifest>(
        *layout::ParseManifest(c["src_manifest"].get<std::string>()));
    auto empty = std::make_shared<const layout::Manifest>();
    EXPECT_EQ(StreamRoom(plan, src, empty, {}, true).status().code(),
              plan->ExpandCoalesced(*src, *empty, *std::make_unique<CopyList>()).code());
    if (!plan->layered().ok()) {
      EXPECT_EQ(StreamRoom(plan, src, src, {0, 1}, true).status().code(),
                absl::StatusCode::kFailedPrecondition);
    }
  }
}

}  // namespace
}  // namespace kvrail::plan
