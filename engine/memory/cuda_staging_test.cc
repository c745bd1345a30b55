// Tests of CudaStaging (cuda_staging.h). Option checks and the "no GPU" answer run everywhere the
// toolkit is; the staging itself runs where a GPU is lent and skips, saying why, elsewhere.
#include "engine/memory/cuda_staging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/memory/cuda_arena.h"
#include "engine/memory/cuda_test_support.h"
#include "engine/memory/pattern.h"

namespace kvrail {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kMiB = 1 << 20;

TEST(CudaStagingTest, WithoutGpuCreateSaysWhyInOneLine) {
  const absl::Status reason = CudaAvailable();
  if (reason.ok()) GTEST_SKIP() << "a GPU is present; nothing to explain";
  const absl::Status status = CudaStaging::Create(StagingOptions{}).status();
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status;
#if KVRAIL_HAVE_CUDA
  // e.g. "no GPU: cudaGetDeviceCount returned 35 (cudaErrorInsufficientDriver: ...)"
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("no GPU"));
  EXPECT_EQ(status, reason);
#else
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("built without CUDA"));
#endif
}

TEST(CudaStagingOptionsTest, ZeroChunkIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status = CudaStaging::Create({.chunk_bytes = 0}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "CUDA staging on device 0: chunk_bytes 0: a chunk holds at least one byte");
}

TEST(CudaStagingOptionsTest, DepthBelowOneIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  for (const int depth : {0, -3}) {
    const absl::Status status = CudaStaging::Create({.depth = depth}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), absl::StrCat("CUDA staging on device 0: depth ", depth,
                                             ": at least one chunk must be in flight"));
  }
}

TEST(CudaStagingOptionsTest, PinnedSizeOverflowIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status =
      CudaStaging::Create({.chunk_bytes = UINT64_MAX / 2, .depth = 3}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("do not fit in the address space"));
}

TEST(CudaStagingOptionsTest, NegativeDeviceIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status = CudaStaging::Create({.device = -1}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "CUDA staging on device -1: device -1 is not a device index");
}

// ---- GPU only: these run where a GPU is lent, and skip elsewhere. ----

TEST(CudaStagingGpuTest, HoldsDepthChunksOfPinnedMemory) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging =
      CudaStaging::Create({.chunk_bytes = 1 * kMiB, .depth = 3});
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_EQ((*staging)->pinned_bytes(), 3 * kMiB);
  EXPECT_EQ((*staging)->chunk_bytes(), 1 * kMiB);
  EXPECT_EQ((*staging)->depth(), 3);
  EXPECT_EQ((*staging)->device(), 0);
}

TEST(CudaStagingGpuTest, DeviceBeyondTheVisibleOnesIsRejected) {
  SKIP_WITHOUT_GPU();
  const absl::Status status = CudaStaging::Create({.device = 4096}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("device 4096 is not visible"));
}

struct SinkCall {
  const uint8_t* host;
  uint64_t offset;
  uint64_t length;
};

// 64 MiB and a partial chunk, from an odd offset of a patterned arena, with the default options
// (4 MiB chunks, 4 in flight). Every chunk is checked inside its sink after a pause: were its
// buffer refilled by a later chunk before the sink returned, the bytes would no longer match.
TEST(CudaStagingGpuTest, StagesOut64MiBInOrderThroughAtMostDepthBuffers) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kSkip = 7;
  constexpr uint64_t kLength = 64 * kMiB + 12345;
  constexpr uint64_t kSeed = 31;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kSkip + kLength, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(kSeed).ok());
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging = CudaStaging::Create(StagingOptions{});
  ASSERT_TRUE(staging.ok()) << staging.status();
  const StagingOptions defaults;

  std::vector<SinkCall> calls;
  const absl::Status status = (*staging)->StageOut(
      arena->data() + kSkip, kLength,
      [&](const uint8_t* host, uint64_t offset, uint64_t length) -> absl::Status {
        calls.push_back({host, offset, length});
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (FirstPatternMismatch(absl::MakeConstSpan(host, length), kSeed, kSkip + offset) !=
            std::nullopt) {
          return absl::DataLossError(absl::StrCat("chunk at offset ", offset, " mismatches"));
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;

  const uint64_t chunk = defaults.chunk_bytes;
  ASSERT_EQ(calls.size(), kLength / chunk + 1);
  std::set<const uint8_t*> buffers;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].offset, i * chunk) << i;
    EXPECT_EQ(calls[i].length, i + 1 < calls.size() ? chunk : kLength % chunk) << i;
    buffers.insert(calls[i].host);
    // Chunk i + depth reuses chunk i's buffer: the bound on memory in flight.
    if (i >= static_cast<size_t>(defaults.depth)) {
      EXPECT_EQ(calls[i].host, calls[i - defaults.depth].host) << i;
    }
  }
  EXPECT_EQ(buffers.size(), static_cast<size_t>(defaults.depth));
}

TEST(CudaStagingGpuTest, SinkErrorStopsStagingAndTheObjectStaysUsable) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kLength = 8 * kMiB;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kLength, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(5).ok());
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging =
      CudaStaging::Create({.chunk_bytes = 512 << 10, .depth = 2});
  ASSERT_TRUE(staging.ok()) << staging.status();

  int calls = 0;
  const absl::Status failed = (*staging)->StageOut(
      arena->data(), kLength, [&](const uint8_t*, uint64_t offset, uint64_t) -> absl::Status {
        ++calls;
        if (offset == 3 * (512 << 10)) return absl::UnavailableError("peer went away");
        return absl::OkStatus();
      });
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed.message(),
            "CUDA staging on device 0: StageOut: the sink of the 524288 bytes at offset 1572864: "
            "peer went away");
  EXPECT_EQ(calls, 4);

  uint64_t checked = 0;
  const absl::Status again = (*staging)->StageOut(
      arena->data(), kLength,
      [&](const uint8_t* host, uint64_t offset, uint64_t length) -> absl::Status {
        if (FirstPatternMismatch(absl::MakeConstSpan(host, length), 5, offset) != std::nullopt) {
          return absl::DataLossError(absl::StrCat("chunk at offset ", offset, " mismatches"));
        }
        checked += length;
        return absl::OkStatus();
      });
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_EQ(checked, kLength);
}

TEST(CudaStagingGpuTest, StageOutArgumentsAreChecked) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(4096, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging =
      CudaStaging::Create({.chunk_bytes = 4096, .depth = 1});
  ASSERT_TRUE(staging.ok()) << staging.status();
  int calls = 0;
  const auto sink = [&](const uint8_t*, uint64_t, uint64_t) -> absl::Status {
    ++calls;
    return absl::OkStatus();
  };

  absl::Status status = (*staging)->StageOut(nullptr, 4096, sink);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "CUDA staging on device 0: StageOut: device_src is null");

  status = (*staging)->StageOut(arena->data(), 0, sink);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("length is 0"));

  std::vector<uint8_t> host(4096);
  status = (*staging)->StageOut(host.data(), host.size(), sink);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("device_src is not device memory"));
  EXPECT_EQ(calls, 0);
}

// Pieces of every kind of size, listed out of order, cover a device arena; the chunking ranges
// from pieces far smaller than a chunk (packed into one) to pieces spanning several chunks.
class ScatterInTest : public ::testing::TestWithParam<StagingOptions> {};

TEST_P(ScatterInTest, HostPatternLandsByteExact) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 24 * kMiB + 999;
  constexpr uint64_t kSeed = 77;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(kSeed + 1).ok());  // anything but the bytes expected
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging = CudaStaging::Create(GetParam());
  ASSERT_TRUE(staging.ok()) << staging.status();

  std::vector<uint8_t> source(kBytes);
  FillPattern(absl::MakeSpan(source), kSeed);
  const uint64_t sizes[] = {1, 4095, 64 << 10, 5 * kMiB + 3, 12345, 16 << 10, 16 << 10, 3 * kMiB};
  std::vector<CudaStaging::Scatter> scatters;
  for (uint64_t offset = 0, i = 0; offset < kBytes; ++i) {
    const uint64_t length = std::min(sizes[i % std::size(sizes)], kBytes - offset);
    scatters.push_back({source.data() + offset, arena->data() + offset, length});
    offset += length;
  }
  std::reverse(scatters.begin(), scatters.end());
  const absl::Status status = (*staging)->ScatterIn(scatters);
  ASSERT_TRUE(status.ok()) << status;

  std::vector<uint8_t> landed(kBytes);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(landed)).ok());
  EXPECT_EQ(FirstPatternMismatch(landed, kSeed), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Options, ScatterInTest,
                         ::testing::Values(StagingOptions{},
                                           StagingOptions{.chunk_bytes = 64 << 10, .depth = 2},
                                           StagingOptions{.chunk_bytes = 1000, .depth = 1}));

TEST(CudaStagingGpuTest, ScatterInArgumentsAreCheckedBeforeAnyCopy) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(8192, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(1).ok());
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging = CudaStaging::Create(StagingOptions{});
  ASSERT_TRUE(staging.ok()) << staging.status();
  const std::vector<uint8_t> zeros(4096, 0);

  const struct {
    CudaStaging::Scatter second;
    const char* message;
  } cases[] = {
      {{nullptr, arena->data() + 4096, 4096}, "scatters[1].host is null"},
      {{zeros.data(), nullptr, 4096}, "scatters[1].device is null"},
      {{zeros.data(), arena->data() + 4096, 0}, "scatters[1].length is 0"},
      {{zeros.data(), arena->data() + 4096, 16, 0}, "scatters[1].rows is 0"},
      {{zeros.data(), arena->data() + 4096, 16, 2, 8, 16},
       "scatters[1].host_pitch or device_pitch is below length: rows would overlap"},
  };
  for (const auto& c : cases) {
    const CudaStaging::Scatter scatters[] = {{zeros.data(), arena->data(), 4096}, c.second};
    const absl::Status status = (*staging)->ScatterIn(scatters);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), absl::StrCat("CUDA staging on device 0: ScatterIn: ", c.message));
  }
  // The valid first scatter was not copied either.
  std::vector<uint8_t> landed(8192);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(landed)).ok());
  EXPECT_EQ(FirstPatternMismatch(landed, 1), std::nullopt);
  EXPECT_TRUE((*staging)->ScatterIn({}).ok());
}

// StageOutRows's arguments are checked before any copy, each refusal naming the rule.
TEST(CudaStagingGpuTest, StageOutRowsArgumentsAreChecked) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(1 << 20, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  StagingOptions options;
  options.chunk_bytes = 4096;
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging = CudaStaging::Create(options);
  ASSERT_TRUE(staging.ok()) << staging.status();
  int calls = 0;
  const auto sink = [&](const uint8_t*, uint64_t, uint64_t) {
    ++calls;
    return absl::OkStatus();
  };
  const struct {
    const void* src;
    uint64_t length, rows, pitch;
    const char* message;
  } cases[] = {
      {nullptr, 16, 2, 32, "device_src is null"},
      {arena->data(), 0, 2, 32, "length is 0"},
      {arena->data(), 16, 0, 32, "rows is 0"},
      {arena->data(), 16, 2, 8, "pitch is below length"},
      {arena->data(), 4097, 2, 8192, "a row is longer than a chunk"},
  };
  for (const auto& c : cases) {
    const absl::Status status = (*staging)->StageOutRows(c.src, c.length, c.rows, c.pitch, sink);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
  std::vector<uint8_t> host(4096);
  EXPECT_THAT(std::string((*staging)->StageOutRows(host.data(), 16, 2, 32, sink).message()),
              HasSubstr("device_src is not device memory"));
  EXPECT_EQ(calls, 0);
}

// The staging path end to end, as a GPU-arena room travels without GPUDirect: stage out of one
// arena into a host "wire", scatter the wire into a second arena.
TEST(CudaStagingGpuTest, RoundTripThroughAHostWire) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 32 * kMiB + 1;
  absl::StatusOr<CudaArena> from = CudaArena::Allocate(kBytes, 0);
  absl::StatusOr<CudaArena> to = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(from.ok() && to.ok()) << from.status() << to.status();
  ASSERT_TRUE(from->FillPattern(3).ok());
  absl::StatusOr<std::unique_ptr<CudaStaging>> staging = CudaStaging::Create(StagingOptions{});
  ASSERT_TRUE(staging.ok()) << staging.status();

  std::vector<uint8_t> wire(kBytes);
  ASSERT_TRUE((*staging)
                  ->StageOut(from->data(), kBytes,
                             [&](const uint8_t* host, uint64_t offset, uint64_t length) {
                               memcpy(wire.data() + offset, host, length);
                               return absl::OkStatus();
                             })
                  .ok());
  const CudaStaging::Scatter all[] = {{wire.data(), to->data(), kBytes}};
  ASSERT_TRUE((*staging)->ScatterIn(all).ok());
  std::vector<uint8_t> landed(kBytes);
  ASSERT_TRUE(to->CopyToHost(0, absl::MakeSpan(landed)).ok());
  EXPECT_EQ(FirstPatternMismatch(landed, 3), std::nullopt);
}

}  // namespace
}  // namespace kvrail
