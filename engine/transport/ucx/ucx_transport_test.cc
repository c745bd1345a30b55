// UCX-specific behaviour of UcxTransport; the shared contract is in ucx_conformance_test.
#include "engine/transport/ucx/ucx_transport.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/transport/transport.h"
#include "gtest/gtest.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

UcxOptions Sm() { return {.lanes = 2, .tls = "sm,self", .max_write_bytes = 4 * kMiB}; }
UcxOptions Tcp() {
  return {.lanes = 2, .tls = "tcp", .net_devices = "lo", .max_write_bytes = 4 * kMiB};
}

// Counts completions and remembers the first failure.
class Waiter {
 public:
  Completion Callback() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++expected_;
    }
    return [this](absl::Status status) {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      if (!status.ok() && first_error_.ok()) first_error_ = status;
      changed_.notify_all();
    };
  }
  // The first failure, once every callback handed out has been called.
  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_for(lock, std::chrono::seconds(120),
                           [this] { return done_ == expected_; })) {
      return absl::DeadlineExceededError("completions never came");
    }
    return first_error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int expected_ = 0;
  int done_ = 0;
  absl::Status first_error_;
};

void Fill(std::vector<uint8_t>& bytes, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < bytes.size(); ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    bytes[i] = static_cast<uint8_t>(x >> 56);
  }
}

TEST(UcxTransportTest, CreateRejectsBadOptions) {
  EXPECT_EQ(UcxTransport::Create({.lanes = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(UcxTransport::Create({.max_write_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(UcxTransportTest, BadTimeoutsAreErrorsNamingThem) {
  auto no_wait = UcxTransport::Create({.connect_timeout = absl::ZeroDuration()});
  ASSERT_FALSE(no_wait.ok());
  EXPECT_EQ(no_wait.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_wait.status().message().find("connect_timeout is 0"), std::string::npos)
      << no_wait.status();
  auto negative = UcxTransport::Create({.keepalive_interval = absl::Seconds(-1)});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("keepalive_interval is -1s"), std::string::npos)
      << negative.status();
}

TEST(UcxTransportTest, BadTcpSegmentSizesAreErrorsNamingThem) {
  auto tiny = UcxTransport::Create({.tls = "tcp", .tcp_tx_seg_bytes = 100});
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tiny.status().message().find("tcp_tx_seg_bytes is 100"), std::string::npos)
      << tiny.status();
  auto small_rx = UcxTransport::Create(
      {.tls = "tcp", .tcp_tx_seg_bytes = 64 << 10, .tcp_rx_seg_bytes = 8 << 10});
  ASSERT_FALSE(small_rx.ok());
  EXPECT_NE(small_rx.status().message().find("tcp_rx_seg_bytes is 8192"), std::string::npos)
      << small_rx.status();
}

TEST(UcxTransportTest, TuningEnvironmentNamesTheTcpSegmentSizes) {
  const auto env = UcxTuningEnvironment(UcxOptions{});
  ASSERT_EQ(env.size(), 2u);
  EXPECT_EQ(env[0].first, "UCX_TCP_TX_SEG_SIZE");
  EXPECT_EQ(env[0].second, "65536");
  EXPECT_EQ(env[1].first, "UCX_TCP_RX_SEG_SIZE");
  EXPECT_EQ(env[1].second, "262144");
  EXPECT_TRUE(UcxTuningEnvironment({.tcp_tx_seg_bytes = 0, .tcp_rx_seg_bytes = 0}).empty());
}

TEST(UcxTransportTest, AllocateUsesUcxSharedMemoryWhenASharedMemoryTransportIsLoaded) {
  auto transport = UcxTransport::Create(Sm());
  ASSERT_TRUE(transport.ok()) << transport.status();
  auto shared = (*transport)->Allocate(8 * kMiB);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->placement, "ucx-shm");
  EXPECT_GE(shared->fd, 0);
  EXPECT_TRUE((*transport)->Deregister(shared->region).ok());
}

TEST(UcxTransportTest, AllocateOverTcpOnlyFallsBackToAMemfd) {
  auto transport = UcxTransport::Create(Tcp());
  ASSERT_TRUE(transport.ok()) << transport.status();
  auto shared = (*transport)->Allocate(8 * kMiB);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->placement, "memfd");
  EXPECT_TRUE((*transport)->Deregister(shared->region).ok());
}

TEST(UcxTransportTest, UnknownTlsIsAnErrorNamingIt) {
  auto transport = UcxTransport::Create({.tls = "no_such_transport"});
  ASSERT_FALSE(transport.ok());
  EXPECT_NE(transport.status().message().find("no_such_transport"), std::string::npos)
      << transport.status();
}

TEST(UcxTransportTest, ReportsItsCapabilities) {
  auto transport = UcxTransport::Create(Sm()).value();
  const Capabilities& caps = transport->capabilities();
  EXPECT_EQ(caps.name, "ucx");
  EXPECT_EQ(caps.lanes, 2);
  EXPECT_TRUE(caps.one_sided);
  EXPECT_FALSE(caps.gpu_memory);
  EXPECT_EQ(caps.max_write_bytes, 4 * kMiB);
}

TEST(UcxTransportTest, DescriptorCarriesWorkerAddressesAndPackedRkeys) {
  auto transport = UcxTransport::Create(Sm()).value();
  std::vector<uint8_t> a(4096), b(8192);
  ASSERT_TRUE(transport->Register({a.data(), a.size()}).ok());
  ASSERT_TRUE(transport->Register({b.data(), b.size()}).ok());
  const v1::HandshakeDescriptor d = transport->LocalDescriptor().value();
  EXPECT_EQ(d.transport(), v1::TRANSPORT_KIND_UCX);
  ASSERT_EQ(d.lanes_size(), 2);
  EXPECT_FALSE(d.lanes(0).address().empty());
  EXPECT_NE(d.lanes(0).address(), d.lanes(1).address());  // one worker per lane
  ASSERT_EQ(d.regions_size(), 2);
  EXPECT_GT(d.regions(0).remote_key().size(), 8u);  // a ucp_rkey_pack buffer, not a handle
  EXPECT_FALSE(d.regions(1).remote_key().empty());
}

TEST(UcxTransportTest, ConnectRejectsGarbageRemoteKey) {
  auto sender = UcxTransport::Create(Sm()).value();
  auto receiver = UcxTransport::Create(Sm()).value();
  std::vector<uint8_t> bytes(4096);
  ASSERT_TRUE(receiver->Register({bytes.data(), bytes.size()}).ok());
  v1::HandshakeDescriptor d = receiver->LocalDescriptor().value();
  d.mutable_regions(0)->set_remote_key("");
  EXPECT_EQ(sender->Connect(d).status().code(), absl::StatusCode::kInvalidArgument);
}

// A sender connected to a receiver over `options`, each with a region of `bytes` (the buffers
// are declared first, so they outlive the transports).
struct Link {
  Link(const UcxOptions& options, uint64_t bytes) : source(bytes), destination(bytes) {
    sender = UcxTransport::Create(options).value();
    receiver = UcxTransport::Create(options).value();
    src = sender->Register({source.data(), source.size()}).value();
    EXPECT_TRUE(receiver->Register({destination.data(), destination.size()}).ok());
    peer = sender->Connect(receiver->LocalDescriptor().value()).value();
    base = reinterpret_cast<uintptr_t>(destination.data());
  }
  std::vector<uint8_t> source, destination;
  std::unique_ptr<UcxTransport> sender, receiver;
  RegionId src = 0;
  PeerId peer = 0;
  uint64_t base = 0;
};

// Copies 64 MiB in 1 MiB puts over `options`, keeping at most `window` bytes in flight per lane
// (tcp collapses with many large puts outstanding), and checks every byte.
void Copy64MiB(const UcxOptions& options, uint64_t window) {
  constexpr uint64_t kBytes = 64 * kMiB;
  constexpr uint64_t kSlice = 1 * kMiB;
  Link link(options, kBytes);
  Fill(link.source, 7);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  const int lanes = sender->capabilities().lanes;
  uint64_t offset = 0;
  while (offset < kBytes) {
    Waiter round;
    for (int lane = 0; lane < lanes && offset < kBytes; ++lane) {
      std::vector<Write> writes;
      for (uint64_t bytes = 0; bytes < window && offset < kBytes; bytes += kSlice) {
        writes.push_back({offset, base + offset, kSlice});
        offset += kSlice;
      }
      ASSERT_TRUE(sender->PostWrites(peer, lane, src, writes, round.Callback()).ok());
      ASSERT_TRUE(sender->Flush(peer, lane, round.Callback()).ok());
    }
    ASSERT_TRUE(round.Wait().ok());
  }
  EXPECT_EQ(std::memcmp(source.data(), destination.data(), kBytes), 0);
}

TEST(UcxTransportTest, Copies64MiBPatternedExactlyOverSharedMemory) { Copy64MiB(Sm(), 16 * kMiB); }

TEST(UcxTransportTest, Copies64MiBPatternedExactlyOverTcp) { Copy64MiB(Tcp(), 4 * kMiB); }

// Each lane has a progress thread of its own: a completion on lane 0 that waits for lane 1's
// completion returns, where one thread for every lane would wait for ever (bounded here).
void LanesCompleteIndependently(const UcxOptions& options) {
  Link link(options, kMiB);
  Fill(link.source, 3);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  std::promise<void> lane1_done;
  std::shared_future<void> lane1 = lane1_done.get_future().share();
  std::promise<bool> lane0_saw;
  std::future<bool> saw = lane0_saw.get_future();
  const std::vector<Write> first = {{0, base, kMiB / 2}};
  const std::vector<Write> second = {{kMiB / 2, base + kMiB / 2, kMiB / 2}};
  ASSERT_TRUE(sender
                  ->PostWrites(peer, 0, src, first,
                               [&lane0_saw, lane1](absl::Status) {
                                 lane0_saw.set_value(lane1.wait_for(std::chrono::seconds(30)) ==
                                                     std::future_status::ready);
                               })
                  .ok());
  ASSERT_TRUE(sender
                  ->PostWrites(peer, 1, src, second,
                               [&lane1_done](absl::Status) { lane1_done.set_value(); })
                  .ok());
  EXPECT_TRUE(saw.get()) << "lane 1's completion waited for lane 0's";
  Waiter flushed;
  for (int lane = 0; lane < 2; ++lane) {
    ASSERT_TRUE(sender->Flush(peer, lane, flushed.Callback()).ok());
  }
  ASSERT_TRUE(flushed.Wait().ok());
  EXPECT_EQ(std::memcmp(source.data(), destination.data(), kMiB), 0);
}

TEST(UcxTransportTest, LanesCompleteIndependentlyOverSharedMemory) {
  LanesCompleteIndependently(Sm());
}

TEST(UcxTransportTest, LanesCompleteIndependentlyOverTcp) { LanesCompleteIndependently(Tcp()); }

// A transport closed from inside a completion finishes every other completion, and its owner
// can still destroy it (the destructor joins the lanes' threads).
TEST(UcxTransportTest, CloseFromACompletionEndsEveryLane) {
  Link link(Tcp(), kMiB);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  Waiter all;
  UcxTransport* raw = sender.get();
  auto close_inside = all.Callback();
  const std::vector<Write> writes = {{0, base, 4096}};
  ASSERT_TRUE(raw->PostWrites(peer, 0, src, writes,
                              [raw, close_inside](absl::Status s) {
                                raw->Close();
                                close_inside(s);
                              })
                  .ok());
  for (int i = 0; i < 8; ++i) {
    Completion done = all.Callback();
    // Refused once the transport is closed: then the completion is never called, so count it.
    if (absl::Status posted = raw->PostWrites(peer, 1, src, writes, done); !posted.ok()) {
      done(posted);
    }
  }
  all.Wait().IgnoreError();  // every completion ran, OK or cancelled
  EXPECT_EQ(raw->PostWrites(peer, 1, src, writes, [](absl::Status) {}).code(),
            absl::StatusCode::kFailedPrecondition);
  sender.reset();
}

TEST(UcxTransportTest, DisconnectCancelsOutstandingWorkAndLaterWorkIsNotFound) {
  // The buffers outlive the transports: puts already on the wire still land after Disconnect.
  Link link(Tcp(), 16 * kMiB);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  std::mutex mu;
  std::vector<absl::StatusCode> codes;
  for (uint64_t i = 0; i < 16; ++i) {
    const std::vector<Write> writes = {{i * kMiB, base + i * kMiB, kMiB}};
    ASSERT_TRUE(sender
                    ->PostWrites(peer, 0, src, writes,
                                 [&](absl::Status s) {
                                   std::lock_guard<std::mutex> lock(mu);
                                   codes.push_back(s.code());
                                 })
                    .ok());
  }
  ASSERT_TRUE(sender->Disconnect(peer).ok());
  sender->Close();  // every completion has been called
  ASSERT_EQ(codes.size(), 16u);
  for (absl::StatusCode code : codes) {
    EXPECT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled)
        << static_cast<int>(code);
  }
}

}  // namespace
}  // namespace kvrail::transport
