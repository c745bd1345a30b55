#include "engine/transport/transport_conformance.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/transport/completion_recorder.h"
#include "engine/transport/transport.h"
#include "gtest/gtest.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

std::string TransportFactoryName(const testing::TestParamInfo<TransportFactory>& info) {
  return info.param.name;
}

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A deterministic byte pattern that differs at every 8-byte word.
void FillPattern(std::vector<uint8_t>& bytes, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(&bytes[i], &z, 8);
  }
}

// A completion for calls that are expected to fail, and so never call it.
void Ignore(const absl::Status& /*status*/) {}

bool AllZero(const std::vector<uint8_t>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

uint64_t AddressOf(const std::vector<uint8_t>& bytes) {
  return reinterpret_cast<uintptr_t>(bytes.data());
}

// A sender connected to a receiver, with one source and one destination region. The buffers
// are declared first so that they outlive the transports.
class Pair {
 public:
  Pair(const TransportFactory& factory, uint64_t source_bytes, uint64_t destination_bytes)
      : source(source_bytes), destination(destination_bytes) {
    FillPattern(source, 1);
    sender = factory.make();
    receiver = factory.make();
    EXPECT_NE(sender, nullptr);
    EXPECT_NE(receiver, nullptr);
    source_region = sender->Register({source.data(), source.size()}).value();
    destination_region = receiver->Register({destination.data(), destination.size()}).value();
    peer = sender->Connect(receiver->LocalDescriptor().value()).value();
  }

  uint64_t destination_base() const { return AddressOf(destination); }

  // Flushes `lane` and waits for it; the flush's status.
  absl::Status FlushAndWait(int lane = 0) {
    Recorder flush(1);
    absl::Status posted = sender->Flush(peer, lane, flush.Callback(0));
    if (!posted.ok()) return posted;
    if (!flush.WaitAll()) return absl::DeadlineExceededError("flush never completed");
    return flush.status(0);
  }

  std::vector<uint8_t> source;
  std::vector<uint8_t> destination;
  std::unique_ptr<Transport> sender;
  std::unique_ptr<Transport> receiver;
  RegionId source_region = 0;
  RegionId destination_region = 0;
  PeerId peer = 0;
};

// Writes still in flight when a test acts: kFenceBatches batches of one kFenceChunk-byte write
// each, from the start of the source into consecutive destination chunks, over every lane;
// batch b completes as `recorder`'s operation b.
constexpr int kFenceBatches = 256;
constexpr uint64_t kFenceChunk = uint64_t{256} << 10;

void PostChunks(Pair& pair, Recorder& recorder) {
  const int lanes = pair.sender->capabilities().lanes;
  for (int b = 0; b < kFenceBatches; ++b) {
    const std::vector<Write> writes = {{0, pair.destination_base() + b * kFenceChunk, kFenceChunk}};
    ASSERT_TRUE(
        pair.sender
            ->PostWrites(pair.peer, b % lanes, pair.source_region, writes, recorder.Callback(b))
            .ok());
  }
}

TEST_P(TransportConformanceTest, CopiesPatterned64MiBRegionExactlyInManyBatchesOverAllLanes) {
  constexpr uint64_t kBytes = 64 * kMiB;
  constexpr uint64_t kSlice = uint64_t{64} << 10;
  constexpr int kWritesPerBatch = 8;
  Pair pair(GetParam(), kBytes, kBytes);
  const int lanes = pair.sender->capabilities().lanes;
  ASSERT_GE(lanes, 2);

  // Slices in reverse order, batches striped over the lanes.
  std::vector<Write> writes;
  for (uint64_t offset = kBytes; offset > 0; offset -= kSlice) {
    writes.push_back({offset - kSlice, pair.destination_base() + offset - kSlice, kSlice});
  }
  const int batches = static_cast<int>(writes.size()) / kWritesPerBatch;
  ASSERT_GE(batches, 100);
  Recorder recorder(batches + lanes);
  for (int b = 0; b < batches; ++b) {
    ASSERT_TRUE(pair.sender
                    ->PostWrites(pair.peer, b % lanes, pair.source_region,
                                 absl::MakeConstSpan(writes).subspan(size_t{kWritesPerBatch} * b,
                                                                     kWritesPerBatch),
                                 recorder.Callback(b))
                    .ok());
  }
  for (int lane = 0; lane < lanes; ++lane) {
    ASSERT_TRUE(pair.sender->Flush(pair.peer, lane, recorder.Callback(batches + lane)).ok());
  }
  ASSERT_TRUE(recorder.WaitAll());
  for (int op = 0; op < batches + lanes; ++op) EXPECT_TRUE(recorder.status(op).ok()) << op;
  EXPECT_EQ(std::memcmp(pair.source.data(), pair.destination.data(), kBytes), 0);
}

// Head-sliced pages (issue 31): 64 strided writes of 16 rows of 1 KiB, the source rows
// contiguous, the destination's every other KiB, in batches of 8 over every lane, beside a
// one-row write. A backend that takes rows (Capabilities::strided_writes) lands every row and
// writes nothing between them; one that does not refuses the batch whole and writes nothing.
TEST_P(TransportConformanceTest, AStridedWriteLandsEveryRowAndNothingBetween) {
  constexpr uint64_t kRow = 1024;
  constexpr uint64_t kRows = 16;
  constexpr int kPages = 64;
  Pair pair(GetParam(), kPages * kRows * kRow + kRow, 2 * kPages * kRows * kRow + kRow);
  const uint64_t base = pair.destination_base();
  const int lanes = pair.sender->capabilities().lanes;
  std::vector<Write> writes;
  for (int p = 0; p < kPages; ++p) {
    writes.push_back(Write{.local_offset = p * kRows * kRow,
                           .remote_address = base + 2 * p * kRows * kRow,
                           .length = kRow,
                           .rows = kRows,
                           .local_stride = kRow,
                           .remote_stride = 2 * kRow});
  }
  // The odd one out: a row of one write, into the destination's last KiB.
  writes.push_back(Write{.local_offset = kPages * kRows * kRow,
                         .remote_address = base + 2 * kPages * kRows * kRow,
                         .length = kRow});
  constexpr size_t kPerBatch = 8;
  const size_t batches = (writes.size() + kPerBatch - 1) / kPerBatch;
  Recorder recorder(static_cast<int>(batches));
  absl::Status first;
  for (size_t b = 0; b < batches; ++b) {
    const absl::Status posted =
        pair.sender->PostWrites(pair.peer, static_cast<int>(b) % lanes, pair.source_region,
                                absl::MakeConstSpan(writes).subspan(b * kPerBatch, kPerBatch),
                                recorder.Callback(static_cast<int>(b)));
    if (!pair.sender->capabilities().strided_writes) {
      EXPECT_EQ(posted.code(), absl::StatusCode::kInvalidArgument) << posted;
      EXPECT_NE(posted.message().find(pair.sender->capabilities().max_gather_rows > 1
                                          ? "16 rows of 1024 bytes landing 2048 apart"
                                          : "16 rows; this transport takes one row a write"),
                absl::string_view::npos)
          << posted;
      EXPECT_TRUE(pair.FlushAndWait().ok());
      EXPECT_TRUE(AllZero(pair.destination));
      return;
    }
    ASSERT_TRUE(posted.ok()) << posted;
  }
  for (int lane = 0; lane < lanes; ++lane) ASSERT_TRUE(pair.FlushAndWait(lane).ok());
  ASSERT_TRUE(recorder.WaitAll());
  for (int op = 0; op < static_cast<int>(batches); ++op) {
    EXPECT_TRUE(recorder.status(op).ok()) << op;
  }
  for (int p = 0; p < kPages; ++p) {
    for (uint64_t r = 0; r < kRows; ++r) {
      const uint8_t* landed = &pair.destination[(2 * p * kRows + 2 * r) * kRow];
      ASSERT_EQ(std::memcmp(landed, &pair.source[(p * kRows + r) * kRow], kRow), 0)
          << "page " << p << " row " << r;
      ASSERT_TRUE(std::all_of(landed + kRow, landed + 2 * kRow, [](uint8_t b) { return b == 0; }))
          << "between rows " << r << " and " << r + 1 << " of page " << p;
    }
  }
  EXPECT_EQ(std::memcmp(&pair.destination[2 * kPages * kRows * kRow],
                        &pair.source[kPages * kRows * kRow], kRow),
            0);
}

// Rows gathered from a strided source into contiguous bytes at the peer (issue 31: a 1:2
// route's pages; verbs' scatter-gather lists): 32 pages of 16 rows of 1 KiB, the source's every
// other KiB, the destination's back to back, as many rows a write as the backend takes
// (MaxRowsPerWrite), over every lane. Every row lands in order and the source's rows between
// stay unsent. A backend that gathers a limited number of rows refuses a write of one more
// whole, writing nothing.
TEST_P(TransportConformanceTest, RowsGatheredFromAStridedSourceLandBackToBack) {
  constexpr uint64_t kRow = 1024;
  constexpr uint64_t kRows = 16;
  constexpr int kPages = 32;
  Pair pair(GetParam(), 2 * kPages * kRows * kRow, kPages * kRows * kRow + kRow);
  const Capabilities& caps = pair.sender->capabilities();
  const uint64_t base = pair.destination_base();
  const int lanes = caps.lanes;
  if (!caps.strided_writes && caps.max_gather_rows > 1) {
    const uint64_t over = caps.max_gather_rows + 1;
    const Write too_many{.local_offset = 0,
                         .remote_address = base,
                         .length = 8,
                         .rows = over,
                         .local_stride = 16,
                         .remote_stride = 8};
    const absl::Status refused =
        pair.sender->PostWrites(pair.peer, 0, pair.source_region, {&too_many, 1}, Ignore);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_NE(refused.message().find(absl::StrCat("at most ", caps.max_gather_rows, " a write")),
              absl::string_view::npos)
        << refused;
    EXPECT_TRUE(pair.FlushAndWait().ok());
    EXPECT_TRUE(AllZero(pair.destination));
  }
  const uint64_t per_write = std::min<uint64_t>(kRows, MaxRowsPerWrite(caps, kRow, kRow));
  std::vector<Write> writes;
  for (int p = 0; p < kPages; ++p) {
    for (uint64_t r = 0; r < kRows; r += per_write) {
      writes.push_back(Write{.local_offset = (p * kRows + r) * 2 * kRow,
                             .remote_address = base + (p * kRows + r) * kRow,
                             .length = kRow,
                             .rows = per_write,
                             .local_stride = 2 * kRow,
                             .remote_stride = kRow});
    }
  }
  constexpr size_t kPerBatch = 8;
  const size_t batches = (writes.size() + kPerBatch - 1) / kPerBatch;
  Recorder recorder(static_cast<int>(batches));
  for (size_t b = 0; b < batches; ++b) {
    const size_t n = std::min(kPerBatch, writes.size() - b * kPerBatch);
    ASSERT_TRUE(pair.sender
                    ->PostWrites(pair.peer, static_cast<int>(b) % lanes, pair.source_region,
                                 absl::MakeConstSpan(writes).subspan(b * kPerBatch, n),
                                 recorder.Callback(static_cast<int>(b)))
                    .ok());
  }
  for (int lane = 0; lane < lanes; ++lane) ASSERT_TRUE(pair.FlushAndWait(lane).ok());
  ASSERT_TRUE(recorder.WaitAll());
  for (int op = 0; op < static_cast<int>(batches); ++op) {
    EXPECT_TRUE(recorder.status(op).ok()) << op;
  }
  for (uint64_t r = 0; r < kPages * kRows; ++r) {
    ASSERT_EQ(std::memcmp(&pair.destination[r * kRow], &pair.source[2 * r * kRow], kRow), 0)
        << "row " << r;
  }
  EXPECT_TRUE(std::all_of(pair.destination.end() - kRow, pair.destination.end(),
                          [](uint8_t b) { return b == 0; }));
}

TEST_P(TransportConformanceTest, OutOfBoundsDestinationRejectsWholeBatchAndWritesNothing) {
  Pair pair(GetParam(), 4096, 4096);
  const uint64_t base = pair.destination_base();
  // The third write ends one byte past the destination region.
  const std::vector<Write> writes = {
      {0, base, 1024}, {1024, base + 1024, 1024}, {2048, base + 3073, 1024}, {0, base, 8}};
  Recorder recorder(1);
  const absl::Status status =
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, recorder.Callback(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("write 2 of 4"), absl::string_view::npos) << status;
  EXPECT_TRUE(pair.FlushAndWait().ok());
  EXPECT_EQ(recorder.calls(0), 0);
  EXPECT_TRUE(AllZero(pair.destination));
}

TEST_P(TransportConformanceTest, DestinationBelowRegionRejectsBatch) {
  Pair pair(GetParam(), 4096, 4096);
  const std::vector<Write> writes = {{0, pair.destination_base() - 1, 16}};
  const absl::Status status =
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(pair.FlushAndWait().ok());
  EXPECT_TRUE(AllZero(pair.destination));
}

TEST_P(TransportConformanceTest, OutOfBoundsSourceRejectsWholeBatchAndWritesNothing) {
  Pair pair(GetParam(), 4096, 8192);
  const uint64_t base = pair.destination_base();
  const std::vector<Write> writes = {{0, base, 1024}, {4000, base + 4096, 97}};
  const absl::Status status =
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("source"), absl::string_view::npos) << status;
  EXPECT_TRUE(pair.FlushAndWait().ok());
  EXPECT_TRUE(AllZero(pair.destination));
}

TEST_P(TransportConformanceTest, SourceOffsetThatWrapsPast2To64RejectsBatch) {
  Pair pair(GetParam(), 4096, 4096);
  const std::vector<Write> writes = {{UINT64_MAX - 7, pair.destination_base(), 16}};
  EXPECT_EQ(pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportConformanceTest, ZeroLengthWriteRejectsWholeBatch) {
  Pair pair(GetParam(), 4096, 4096);
  const uint64_t base = pair.destination_base();
  const std::vector<Write> writes = {{0, base, 16}, {16, base + 16, 0}};
  const absl::Status status =
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(pair.FlushAndWait().ok());
  EXPECT_TRUE(AllZero(pair.destination));
}

TEST_P(TransportConformanceTest, EmptyBatchIsRejected) {
  Pair pair(GetParam(), 4096, 4096);
  EXPECT_EQ(pair.sender->PostWrites(pair.peer, 0, pair.source_region, {}, Ignore).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportConformanceTest, UnknownPeerIsNotFound) {
  Pair pair(GetParam(), 4096, 4096);
  const std::vector<Write> writes = {{0, pair.destination_base(), 16}};
  EXPECT_EQ(pair.sender->PostWrites(pair.peer + 100, 0, pair.source_region, writes, Ignore).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(pair.sender->Flush(pair.peer + 100, 0, Ignore).code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, UnknownSourceRegionIsNotFound) {
  Pair pair(GetParam(), 4096, 4096);
  const std::vector<Write> writes = {{0, pair.destination_base(), 16}};
  EXPECT_EQ(pair.sender->PostWrites(pair.peer, 0, pair.source_region + 100, writes, Ignore).code(),
            absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, LaneOutsideCapabilitiesIsRejected) {
  Pair pair(GetParam(), 4096, 4096);
  const int lanes = pair.sender->capabilities().lanes;
  const std::vector<Write> writes = {{0, pair.destination_base(), 16}};
  for (int lane : {-1, lanes}) {
    EXPECT_EQ(pair.sender->PostWrites(pair.peer, lane, pair.source_region, writes, Ignore).code(),
              absl::StatusCode::kInvalidArgument)
        << lane;
    EXPECT_EQ(pair.sender->Flush(pair.peer, lane, Ignore).code(),
              absl::StatusCode::kInvalidArgument)
        << lane;
  }
}

TEST_P(TransportConformanceTest, WriteLongerThanMaxWriteBytesIsRejected) {
  Pair pair(GetParam(), 4096, 4096);
  const uint64_t max = pair.sender->capabilities().max_write_bytes;
  ASSERT_LT(max, UINT64_MAX);
  const std::vector<Write> writes = {{0, pair.destination_base(), max + 1}};
  EXPECT_EQ(pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportConformanceTest, CompletionsAreCalledExactlyOnceAndNeverInline) {
  constexpr int kBatches = 64;
  Pair pair(GetParam(), uint64_t{64} << 10, uint64_t{64} << 10);
  const int lanes = pair.sender->capabilities().lanes;
  Recorder recorder(kBatches + 1);
  for (int b = 0; b < kBatches; ++b) {
    const std::vector<Write> writes = {{static_cast<uint64_t>(b) * 1024,
                                        pair.destination_base() + static_cast<uint64_t>(b) * 1024,
                                        1024}};
    // A completion called inline would run before PostWrites returns, on this thread.
    ASSERT_TRUE(
        pair.sender
            ->PostWrites(pair.peer, b % lanes, pair.source_region, writes, recorder.Callback(b))
            .ok());
  }
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(kBatches)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  pair.sender->Close();  // every completion has been called by now; none may come again
  for (int op = 0; op <= kBatches; ++op) {
    EXPECT_EQ(recorder.calls(op), 1) << op;
    EXPECT_TRUE(recorder.status(op).ok()) << op;
  }
  for (std::thread::id id : recorder.threads()) EXPECT_NE(id, std::this_thread::get_id());
}

TEST_P(TransportConformanceTest, FlushCompletesAfterEveryEarlierBatchOfItsLane) {
  constexpr int kBatches = 32;
  Pair pair(GetParam(), 1 * kMiB, 1 * kMiB);
  Recorder recorder(kBatches + 1);
  for (int b = 0; b < kBatches; ++b) {
    const std::vector<Write> writes = {{static_cast<uint64_t>(b) * 32768,
                                        pair.destination_base() + static_cast<uint64_t>(b) * 32768,
                                        32768}};
    ASSERT_TRUE(
        pair.sender->PostWrites(pair.peer, 1, pair.source_region, writes, recorder.Callback(b))
            .ok());
  }
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 1, recorder.Callback(kBatches)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  const std::vector<int> order = recorder.order();
  ASSERT_EQ(order.size(), kBatches + 1u);
  EXPECT_EQ(order.back(), kBatches);
  EXPECT_TRUE(recorder.status(kBatches).ok());
  EXPECT_EQ(std::memcmp(pair.source.data(), pair.destination.data(), kMiB), 0);
}

TEST_P(TransportConformanceTest, CompletionMayPostMoreWork) {
  Pair pair(GetParam(), 4096, 4096);
  Recorder recorder(2);
  const std::vector<Write> first = {{0, pair.destination_base(), 2048}};
  const std::vector<Write> second = {{2048, pair.destination_base() + 2048, 2048}};
  Completion then = recorder.Callback(1);
  Completion first_done = recorder.Callback(0);
  ASSERT_TRUE(
      pair.sender
          ->PostWrites(
              pair.peer, 0, pair.source_region, first,
              [&](absl::Status status) {
                EXPECT_TRUE(
                    pair.sender->PostWrites(pair.peer, 0, pair.source_region, second, then).ok());
                first_done(std::move(status));
              })
          .ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok());
  EXPECT_TRUE(recorder.status(1).ok());
  EXPECT_TRUE(pair.FlushAndWait().ok());  // local completion only; the flush means landed
  EXPECT_EQ(std::memcmp(pair.source.data(), pair.destination.data(), 4096), 0);
}

TEST_P(TransportConformanceTest, ConcurrentPostsFromSeveralThreadsAllLand) {
  constexpr uint64_t kThreads = 4;
  constexpr uint64_t kBatchesPerThread = 32;
  constexpr uint64_t kChunk = 4096;
  Pair pair(GetParam(), kThreads * kBatchesPerThread * kChunk,
            kThreads * kBatchesPerThread * kChunk);
  const int lanes = pair.sender->capabilities().lanes;
  Recorder recorder(kThreads * kBatchesPerThread);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (uint64_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t b = 0; b < kBatchesPerThread; ++b) {
        const uint64_t op = t * kBatchesPerThread + b;
        const std::vector<Write> writes = {
            {op * kChunk, pair.destination_base() + op * kChunk, kChunk}};
        EXPECT_TRUE(pair.sender
                        ->PostWrites(pair.peer, static_cast<int>(t) % lanes, pair.source_region,
                                     writes, recorder.Callback(static_cast<int>(op)))
                        .ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(recorder.WaitAll());
  for (int lane = 0; lane < lanes; ++lane) EXPECT_TRUE(pair.FlushAndWait(lane).ok());
  EXPECT_EQ(std::memcmp(pair.source.data(), pair.destination.data(), pair.source.size()), 0);
}

TEST_P(TransportConformanceTest, DescriptorVersionRisesOnEveryRegisterAndDeregister) {
  std::unique_ptr<Transport> transport = GetParam().make();
  std::vector<uint8_t> a(4096), b(4096);
  const uint64_t v0 = transport->LocalDescriptor().value().version();
  const RegionId ra = transport->Register({a.data(), a.size()}).value();
  const uint64_t v1 = transport->LocalDescriptor().value().version();
  const RegionId rb = transport->Register({b.data(), b.size()}).value();
  const uint64_t v2 = transport->LocalDescriptor().value().version();
  ASSERT_TRUE(transport->Deregister(ra).ok());
  const uint64_t v3 = transport->LocalDescriptor().value().version();
  ASSERT_TRUE(transport->Deregister(rb).ok());
  const uint64_t v4 = transport->LocalDescriptor().value().version();
  EXPECT_LT(v0, v1);
  EXPECT_LT(v1, v2);
  EXPECT_LT(v2, v3);
  EXPECT_LT(v3, v4);
  EXPECT_EQ(transport->LocalDescriptor().value().version(), v4);  // reading changes nothing
}

TEST_P(TransportConformanceTest, DescriptorListsLanesAndRegisteredRegions) {
  std::unique_ptr<Transport> transport = GetParam().make();
  std::vector<uint8_t> a(4096), b(8192);
  ASSERT_TRUE(transport->Register({a.data(), a.size()}).ok());
  ASSERT_TRUE(transport->Register({b.data(), b.size()}).ok());
  const v1::HandshakeDescriptor descriptor = transport->LocalDescriptor().value();
  EXPECT_EQ(descriptor.lanes_size(), transport->capabilities().lanes);
  ASSERT_EQ(descriptor.regions_size(), 2);
  EXPECT_EQ(descriptor.regions(0).base(), AddressOf(a));
  EXPECT_EQ(descriptor.regions(0).length(), a.size());
  EXPECT_EQ(descriptor.regions(1).base(), AddressOf(b));
  EXPECT_EQ(descriptor.regions(1).length(), b.size());
  EXPECT_FALSE(descriptor.regions(0).remote_key().empty());
  EXPECT_EQ(descriptor.regions(0).memory_kind(), v1::MEMORY_KIND_HOST);
}

TEST_P(TransportConformanceTest, DeregisterOfUnknownRegionIsNotFound) {
  std::unique_ptr<Transport> transport = GetParam().make();
  EXPECT_EQ(transport->Deregister(12345).code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, RegisterRejectsEmptyAndOverlappingRegions) {
  std::unique_ptr<Transport> transport = GetParam().make();
  std::vector<uint8_t> bytes(8192);
  EXPECT_EQ(transport->Register({bytes.data(), 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transport->Register({nullptr, 16}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(transport->Register({bytes.data() + 1024, 4096}).ok());
  EXPECT_EQ(transport->Register({bytes.data(), 1025}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transport->Register({bytes.data() + 5119, 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(transport->Register({bytes.data(), 1024}).ok());  // adjacent is fine
  EXPECT_TRUE(transport->Register({bytes.data() + 5120, 16}).ok());
}

TEST_P(TransportConformanceTest, WriteIntoDeregisteredRemoteRegionFailsUnavailable) {
  Pair pair(GetParam(), 4096, 4096);
  const uint64_t base = pair.destination_base();
  ASSERT_TRUE(pair.receiver->Deregister(pair.destination_region).ok());
  // The sender still holds the old descriptor. Free the bytes so that ASan sees any write.
  pair.destination.clear();
  pair.destination.shrink_to_fit();
  Recorder recorder(1);
  const std::vector<Write> writes = {{0, base, 4096}};
  ASSERT_TRUE(
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, recorder.Callback(0)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kUnavailable) << recorder.status(0);
}

TEST_P(TransportConformanceTest, WriteIntoClosedPeerFailsUnavailable) {
  Pair pair(GetParam(), 4096, 4096);
  pair.receiver->Close();
  Recorder recorder(2);
  const std::vector<Write> writes = {{0, pair.destination_base(), 4096}};
  ASSERT_TRUE(
      pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.sender->Flush(pair.peer, 0, recorder.Callback(1)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  // The batch may complete locally before the loss is seen (its bytes left this process);
  // if it reports the loss, it says Unavailable. The flush never claims the bytes landed.
  EXPECT_TRUE(recorder.status(0).ok() ||
              recorder.status(0).code() == absl::StatusCode::kUnavailable)
      << recorder.status(0);
  EXPECT_EQ(recorder.status(1).code(), absl::StatusCode::kUnavailable) << recorder.status(1);
  EXPECT_TRUE(AllZero(pair.destination));
}

TEST_P(TransportConformanceTest, CloseWithOutstandingOperationsCompletesEachOnceAndReturns) {
  Pair pair(GetParam(), kFenceChunk, kFenceBatches * kFenceChunk);
  const int lanes = pair.sender->capabilities().lanes;
  Recorder recorder(kFenceBatches + lanes);
  PostChunks(pair, recorder);
  for (int lane = 0; lane < lanes; ++lane) {
    ASSERT_TRUE(pair.sender->Flush(pair.peer, lane, recorder.Callback(kFenceBatches + lane)).ok());
  }
  pair.sender->Close();
  // Close returned: every completion has been called, each once, as OK or as cancelled.
  for (int op = 0; op < kFenceBatches + lanes; ++op) {
    EXPECT_EQ(recorder.calls(op), 1) << op;
    const absl::StatusCode code = recorder.status(op).code();
    EXPECT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled) << op;
  }
}

// Fencing (transport.h): the ways a caller knows that no write it posted can land any more.

TEST_P(TransportConformanceTest, FlushOkMeansEveryEarlierWriteLanded) {
  constexpr int kBatches = 128;
  constexpr uint64_t kChunk = uint64_t{32} << 10;
  Pair pair(GetParam(), kBatches * kChunk, kBatches * kChunk);
  const int lanes = pair.sender->capabilities().lanes;
  Recorder batches(kBatches);
  for (int b = 0; b < kBatches; ++b) {
    const std::vector<Write> writes = {{b * kChunk, pair.destination_base() + b * kChunk, kChunk}};
    ASSERT_TRUE(
        pair.sender
            ->PostWrites(pair.peer, b % lanes, pair.source_region, writes, batches.Callback(b))
            .ok());
  }
  // Only the flushes are waited for: their OK alone must mean that every byte is there.
  Recorder flushes(lanes);
  for (int lane = 0; lane < lanes; ++lane) {
    ASSERT_TRUE(pair.sender->Flush(pair.peer, lane, flushes.Callback(lane)).ok());
  }
  ASSERT_TRUE(flushes.WaitAll());
  for (int lane = 0; lane < lanes; ++lane) {
    ASSERT_TRUE(flushes.status(lane).ok()) << lane << ": " << flushes.status(lane);
  }
  EXPECT_EQ(std::memcmp(pair.source.data(), pair.destination.data(), pair.source.size()), 0);
  ASSERT_TRUE(batches.WaitAll());
}

// Posts enough writes that some are still in flight (`kFenceBatches` of one `kFenceChunk`
// write each, into consecutive destination chunks, over every lane), runs `fence`, and expects
// the destination to stay as it is then while the test looks at it for a while: a write that
// could still land (in a queue, a socket or a peer's FIFO) would change it. The wait only gives
// a late write time to show itself; nothing is timed.
void ExpectNoWriteLandsAfter(const TransportFactory& factory,
                             const std::function<void(Pair&, Recorder&)>& fence) {
  Pair pair(factory, kFenceChunk, kFenceBatches * kFenceChunk);
  Recorder recorder(kFenceBatches);
  PostChunks(pair, recorder);
  fence(pair, recorder);
  if (testing::Test::HasFatalFailure()) return;
  const std::vector<uint8_t> fenced = pair.destination;
  for (int look = 0; look < 20; ++look) {
    absl::SleepFor(absl::Milliseconds(10));
    ASSERT_TRUE(pair.destination == fenced) << "a write landed after the fence, look " << look;
  }
}

TEST_P(TransportConformanceTest, NoWriteLandsAfterDisconnectReturns) {
  ExpectNoWriteLandsAfter(GetParam(), [](Pair& pair, Recorder& recorder) {
    ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
    // Disconnect returned and every completion was delivered (landed or cancelled).
    ASSERT_TRUE(recorder.WaitAll());
    for (int op = 0; op < kFenceBatches; ++op) {
      const absl::StatusCode code = recorder.status(op).code();
      EXPECT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled)
          << op << ": " << recorder.status(op);
    }
  });
}

TEST_P(TransportConformanceTest, NoWriteLandsAfterCloseReturns) {
  ExpectNoWriteLandsAfter(GetParam(), [](Pair& pair, Recorder& recorder) {
    pair.sender->Close();  // every completion has been called when it returns
    for (int op = 0; op < kFenceBatches; ++op) EXPECT_EQ(recorder.calls(op), 1) << op;
  });
}

TEST_P(TransportConformanceTest, CloseIsIdempotentAndLaterCallsFailPrecondition) {
  Pair pair(GetParam(), 4096, 4096);
  pair.sender->Close();
  pair.sender->Close();
  const std::vector<Write> writes = {{0, pair.destination_base(), 16}};
  EXPECT_EQ(pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pair.sender->Flush(pair.peer, 0, Ignore).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<uint8_t> more(16);
  EXPECT_EQ(pair.sender->Register({more.data(), more.size()}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pair.sender->LocalDescriptor().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pair.sender->Connect(pair.receiver->LocalDescriptor().value()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pair.sender->Allocate(4096).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The engine's view of an allocated region: /proc/<pid>/fd/<fd> opened and mapped as another
// process would (here this process, through a second mapping of the same pages).
class EngineMapping {
 public:
  explicit EngineMapping(const SharedRegion& shared) {
    const std::string path =
        "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(shared.fd);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    if (fd < 0) return;
    struct stat st;
    EXPECT_EQ(fstat(fd, &st), 0);
    size_ = static_cast<size_t>(st.st_size);
    EXPECT_GE(size_, shared.fd_offset + shared.length);
    void* data = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(data, MAP_FAILED);
    if (data == MAP_FAILED) return;
    map_ = static_cast<uint8_t*>(data);
    bytes_ = map_ + shared.fd_offset;
  }
  ~EngineMapping() {
    if (map_ != nullptr) munmap(map_, size_);
  }
  uint8_t* bytes() const { return bytes_; }

 private:
  uint8_t* map_ = nullptr;
  uint8_t* bytes_ = nullptr;
  size_t size_ = 0;
};

TEST_P(TransportConformanceTest, AllocatedRegionIsZeroRegisteredAndSharedThroughItsFd) {
  constexpr uint64_t kBytes = 4 * kMiB;
  Pair pair(GetParam(), kBytes, 4096);
  const uint64_t version = pair.receiver->LocalDescriptor()->version();
  auto shared = pair.receiver->Allocate(kBytes);
  ASSERT_TRUE(shared.ok()) << shared.status();
  ASSERT_NE(shared->base, nullptr);
  EXPECT_EQ(shared->length, kBytes);
  EXPECT_FALSE(shared->placement.empty());
  const auto* base = static_cast<const uint8_t*>(shared->base);
  EXPECT_TRUE(std::all_of(base, base + kBytes, [](uint8_t b) { return b == 0; }));
  auto descriptor = pair.receiver->LocalDescriptor();
  ASSERT_TRUE(descriptor.ok());
  EXPECT_GT(descriptor->version(), version);
  bool listed = false;
  for (const v1::Region& region : descriptor->regions()) {
    listed |=
        region.base() == reinterpret_cast<uintptr_t>(shared->base) && region.length() == kBytes;
  }
  EXPECT_TRUE(listed);

  // The engine writes through its mapping; the transport's pages show it.
  EngineMapping engine(*shared);
  ASSERT_NE(engine.bytes(), nullptr);
  engine.bytes()[kBytes - 1] = 0x5a;
  EXPECT_EQ(base[kBytes - 1], 0x5a);
  engine.bytes()[kBytes - 1] = 0;

  // A peer writes into it; the engine's mapping sees every byte after the flush.
  PeerId peer = pair.sender->Connect(*descriptor).value();
  const uint64_t remote = reinterpret_cast<uintptr_t>(shared->base);
  std::vector<Write> writes;
  for (uint64_t offset = 0; offset < kBytes; offset += kMiB) {
    writes.push_back({offset, remote + offset, kMiB});
  }
  Recorder recorder(2);
  ASSERT_TRUE(
      pair.sender->PostWrites(peer, 0, pair.source_region, writes, recorder.Callback(0)).ok());
  ASSERT_TRUE(pair.sender->Flush(peer, 0, recorder.Callback(1)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok()) << recorder.status(0);
  EXPECT_TRUE(recorder.status(1).ok()) << recorder.status(1);
  EXPECT_EQ(std::memcmp(engine.bytes(), pair.source.data(), kBytes), 0);

  // Deregister frees it: the region leaves the descriptor; the engine's mapping stays valid.
  ASSERT_TRUE(pair.receiver->Deregister(shared->region).ok());
  descriptor = pair.receiver->LocalDescriptor();
  for (const v1::Region& region : descriptor->regions()) {
    EXPECT_NE(region.base(), remote);
  }
  EXPECT_EQ(std::memcmp(engine.bytes(), pair.source.data(), 4096), 0);
  EXPECT_EQ(pair.receiver->Deregister(shared->region).code(), absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, AllocateOfZeroBytesIsRejected) {
  auto transport = GetParam().make();
  auto shared = transport->Allocate(0);
  ASSERT_FALSE(shared.ok());
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shared.status().message().find("length is 0"), std::string::npos) << shared.status();
}

TEST_P(TransportConformanceTest, AllocatedRegionsLeftAtCloseAreFreedWithoutError) {
  auto transport = GetParam().make();
  ASSERT_TRUE(transport->Allocate(kMiB).ok());
  ASSERT_TRUE(transport->Allocate(kMiB).ok());
  transport->Close();
}

TEST_P(TransportConformanceTest, DisconnectedPeerIsUnknown) {
  Pair pair(GetParam(), 4096, 4096);
  ASSERT_TRUE(pair.sender->Disconnect(pair.peer).ok());
  EXPECT_EQ(pair.sender->Disconnect(pair.peer).code(), absl::StatusCode::kNotFound);
  const std::vector<Write> writes = {{0, pair.destination_base(), 16}};
  EXPECT_EQ(pair.sender->PostWrites(pair.peer, 0, pair.source_region, writes, Ignore).code(),
            absl::StatusCode::kNotFound);
}

TEST_P(TransportConformanceTest, ConnectRejectsAnotherTransportsDescriptor) {
  Pair pair(GetParam(), 4096, 4096);
  v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  descriptor.set_transport(descriptor.transport() == v1::TRANSPORT_KIND_VERBS
                               ? v1::TRANSPORT_KIND_UCX
                               : v1::TRANSPORT_KIND_VERBS);
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportConformanceTest, ConnectRejectsOverlappingRegions) {
  Pair pair(GetParam(), 4096, 4096);
  v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  *descriptor.add_regions() = descriptor.regions(0);
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(TransportConformanceTest, ConnectRejectsDescriptorWithoutLanes) {
  Pair pair(GetParam(), 4096, 4096);
  v1::HandshakeDescriptor descriptor = pair.receiver->LocalDescriptor().value();
  descriptor.clear_lanes();
  EXPECT_EQ(pair.sender->Connect(descriptor).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvrail::transport
