// UCX-specific behaviour of UcxTransport; the shared contract is in ucx_conformance_test.
#include "engine/transport/ucx/ucx_transport.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/transport/peer_process.h"
#include "engine/transport/transport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/kvrail/v1/handshake.pb.h"

// Every call the backend makes into a worker, seen on its way to UCX: BUILD.bazel links this
// test with -Wl,--wrap for each function below, so the backend's calls land in __wrap_<name>,
// which records the calling thread and calls on (__real_<name>). A call counts as a stray
// unless the thread making it is a lane's ("ucx-lane<i>", as RunLane names it) and is the one
// thread that has called into that worker (or the worker of that endpoint) since it was made.
namespace ucx_calls {

struct Record {
  std::mutex mu;
  std::map<ucp_worker_h, std::thread::id> owner;  // the one thread calling into each worker
  std::map<ucp_ep_h, ucp_worker_h> worker_of;     // endpoints made by ucp_ep_create
  std::map<std::string, uint64_t> calls;          // by function
  std::vector<std::string> strays;                // "ucp_put_nbx on thread 'main'"
};

Record& record() {
  static Record* r = new Record;
  return *r;
}

std::string ThreadName() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// `worker`: the worker called into, when the call names it or an endpoint made on it.
void Note(const char* what, ucp_worker_h worker) {
  const std::string thread = ThreadName();
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  ++r.calls[what];
  bool stray = thread.rfind("ucx-lane", 0) != 0;
  if (worker != nullptr) {
    auto [it, added] = r.owner.emplace(worker, std::this_thread::get_id());
    if (!added && it->second != std::this_thread::get_id()) stray = true;
  }
  if (stray) r.strays.push_back(absl::StrCat(what, " on thread '", thread, "'"));
}

void NoteEp(const char* what, ucp_ep_h ep) {
  ucp_worker_h worker = nullptr;
  {
    Record& r = record();
    std::lock_guard<std::mutex> lock(r.mu);
    if (auto it = r.worker_of.find(ep); it != r.worker_of.end()) worker = it->second;
  }
  Note(what, worker);  // a reply endpoint of the target's is known by its thread only
}

// Forgets the counts so far (not the strays, which the whole binary reports).
void ResetCalls() {
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  r.calls.clear();
}

std::vector<std::string> Strays() {
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.strays;
}

uint64_t Calls(const std::string& what) {
  Record& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.calls.find(what);
  return it == r.calls.end() ? 0 : it->second;
}

}  // namespace ucx_calls

extern "C" {
ucs_status_ptr_t __real_ucp_put_nbx(ucp_ep_h, const void*, size_t, uint64_t, ucp_rkey_h,
                                    const ucp_request_param_t*);
ucs_status_ptr_t __real_ucp_am_send_nbx(ucp_ep_h, unsigned, const void*, size_t, const void*,
                                        size_t, const ucp_request_param_t*);
ucs_status_ptr_t __real_ucp_ep_flush_nbx(ucp_ep_h, const ucp_request_param_t*);
ucs_status_t __real_ucp_ep_create(ucp_worker_h, const ucp_ep_params_t*, ucp_ep_h*);
ucs_status_t __real_ucp_ep_rkey_unpack(ucp_ep_h, const void*, ucp_rkey_h*);
ucs_status_ptr_t __real_ucp_ep_close_nbx(ucp_ep_h, const ucp_request_param_t*);
unsigned __real_ucp_worker_progress(ucp_worker_h);
void __real_ucp_worker_destroy(ucp_worker_h);
void __real_ucp_request_free(void*);
ucs_status_t __real_ucp_request_check_status(void*);
void __real_ucp_rkey_destroy(ucp_rkey_h);

ucs_status_ptr_t __wrap_ucp_put_nbx(ucp_ep_h ep, const void* buffer, size_t count,
                                    uint64_t remote_addr, ucp_rkey_h rkey,
                                    const ucp_request_param_t* param) {
  ucx_calls::NoteEp("ucp_put_nbx", ep);
  return __real_ucp_put_nbx(ep, buffer, count, remote_addr, rkey, param);
}
ucs_status_ptr_t __wrap_ucp_am_send_nbx(ucp_ep_h ep, unsigned id, const void* header,
                                        size_t header_length, const void* buffer, size_t count,
                                        const ucp_request_param_t* param) {
  ucx_calls::NoteEp("ucp_am_send_nbx", ep);
  return __real_ucp_am_send_nbx(ep, id, header, header_length, buffer, count, param);
}
ucs_status_ptr_t __wrap_ucp_ep_flush_nbx(ucp_ep_h ep, const ucp_request_param_t* param) {
  ucx_calls::NoteEp("ucp_ep_flush_nbx", ep);
  return __real_ucp_ep_flush_nbx(ep, param);
}
ucs_status_t __wrap_ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t* params,
                                  ucp_ep_h* ep_p) {
  ucx_calls::Note("ucp_ep_create", worker);
  const ucs_status_t s = __real_ucp_ep_create(worker, params, ep_p);
  if (s == UCS_OK) {
    std::lock_guard<std::mutex> lock(ucx_calls::record().mu);
    ucx_calls::record().worker_of[*ep_p] = worker;
  }
  return s;
}
ucs_status_t __wrap_ucp_ep_rkey_unpack(ucp_ep_h ep, const void* rkey_buffer, ucp_rkey_h* rkey_p) {
  ucx_calls::NoteEp("ucp_ep_rkey_unpack", ep);
  return __real_ucp_ep_rkey_unpack(ep, rkey_buffer, rkey_p);
}
ucs_status_ptr_t __wrap_ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t* param) {
  ucx_calls::NoteEp("ucp_ep_close_nbx", ep);
  {
    std::lock_guard<std::mutex> lock(ucx_calls::record().mu);
    ucx_calls::record().worker_of.erase(ep);
  }
  return __real_ucp_ep_close_nbx(ep, param);
}
unsigned __wrap_ucp_worker_progress(ucp_worker_h worker) {
  ucx_calls::Note("ucp_worker_progress", worker);
  return __real_ucp_worker_progress(worker);
}
void __wrap_ucp_worker_destroy(ucp_worker_h worker) {
  ucx_calls::Note("ucp_worker_destroy", worker);
  {
    std::lock_guard<std::mutex> lock(ucx_calls::record().mu);
    ucx_calls::record().owner.erase(worker);  // its address may be a later worker's
  }
  __real_ucp_worker_destroy(worker);
}
void __wrap_ucp_request_free(void* request) {
  ucx_calls::Note("ucp_request_free", nullptr);
  __real_ucp_request_free(request);
}
ucs_status_t __wrap_ucp_request_check_status(void* request) {
  ucx_calls::Note("ucp_request_check_status", nullptr);
  return __real_ucp_request_check_status(request);
}
void __wrap_ucp_rkey_destroy(ucp_rkey_h rkey) {
  ucx_calls::Note("ucp_rkey_destroy", nullptr);
  __real_ucp_rkey_destroy(rkey);
}
}  // extern "C"

namespace kvrail::transport {
namespace {

// Over the whole binary, every test included: no call into a worker from any thread but its
// lane's.
class NoStrayUcxCalls : public testing::Environment {
 public:
  void TearDown() override {
    const std::vector<std::string> strays = ucx_calls::Strays();
    if (strays.empty()) return;
    ADD_FAILURE() << strays.size()
                  << " UCX calls off their lane's thread, the first: " << strays.front();
  }
};
testing::Environment* const no_stray_ucx_calls =
    testing::AddGlobalTestEnvironment(new NoStrayUcxCalls);

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
  // How many of the callbacks handed out have been called.
  int Completed() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
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
  EXPECT_EQ(env[1].second, "1048576");
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

// A head-sliced room's shape: the destination [base, base + bytes) cut into pieces, mostly of 1 to
// 2048 bytes with a few of 256 KiB, each from a random source offset, in shuffled order; about
// one piece in 16 is left out (`skipped`, to stay zero).
struct Scattered {
  std::vector<Write> writes;
  std::vector<std::pair<uint64_t, uint64_t>> skipped;  // destination offset, length
};
Scattered ScatteredWrites(uint64_t bytes, uint64_t base, uint64_t seed) {
  Scattered out;
  std::mt19937_64 random(seed);
  for (uint64_t at = 0; at < bytes;) {
    const uint64_t length =
        std::min(bytes - at, random() % 64 == 0 ? uint64_t{256} << 10 : 1 + random() % 2048);
    if (random() % 16 == 0) {
      out.skipped.emplace_back(at, length);
    } else {
      out.writes.push_back({random() % (bytes - length + 1), base + at, length});
    }
    at += length;
  }
  std::shuffle(out.writes.begin(), out.writes.end(), random);
  return out;
}

// Posts `scattered` over both lanes of `peer`, 512 writes a batch, flushes both and checks that
// every write landed exactly and every skipped byte is still zero.
void PostAndCheck(UcxTransport& sender, PeerId peer, RegionId src,
                  const std::vector<uint8_t>& source, const uint8_t* destination, uint64_t base,
                  const Scattered& scattered) {
  const std::vector<Write>& writes = scattered.writes;
  Waiter waiter;
  for (size_t first = 0; first < writes.size(); first += 512) {
    const auto batch =
        absl::MakeConstSpan(writes).subspan(first, std::min<size_t>(512, writes.size() - first));
    ASSERT_TRUE(sender.PostWrites(peer, (first / 512) % 2, src, batch, waiter.Callback()).ok());
  }
  for (int lane = 0; lane < 2; ++lane) {
    ASSERT_TRUE(sender.Flush(peer, lane, waiter.Callback()).ok());
  }
  ASSERT_TRUE(waiter.Wait().ok());
  for (const Write& w : writes) {
    ASSERT_EQ(
        std::memcmp(destination + (w.remote_address - base), &source[w.local_offset], w.length), 0)
        << w.length << " bytes at " << w.remote_address - base;
  }
  for (const auto& [at, length] : scattered.skipped) {
    for (uint64_t i = at; i < at + length; ++i) ASSERT_EQ(destination[i], 0) << i;
  }
}

// Into a peer's UCX shared-memory segment (its Allocate) writes are plain stores on the lane's
// thread (ucp_rkey_ptr): thousands of small scattered rows and a few large writes land exactly,
// nothing else changes, and the flush reports them landed.
TEST(UcxTransportTest, WritesIntoAPeersSharedSegmentAreStoresThatLandExactly) {
  constexpr uint64_t kBytes = 4 * kMiB;
  std::vector<uint8_t> source(kBytes);
  Fill(source, 11);
  auto sender = UcxTransport::Create(Sm()).value();
  auto receiver = UcxTransport::Create(Sm()).value();
  const RegionId src = sender->Register({source.data(), source.size()}).value();
  SharedRegion shared = receiver->Allocate(kBytes).value();
  ASSERT_EQ(shared.placement, "ucx-shm");
  auto* destination = static_cast<uint8_t*>(shared.base);
  std::memset(destination, 0, kBytes);
  const PeerId peer = sender->Connect(receiver->LocalDescriptor().value()).value();
  const uint64_t base = reinterpret_cast<uintptr_t>(shared.base);
  ucx_calls::ResetCalls();
  PostAndCheck(*sender, peer, src, source, destination, base, ScatteredWrites(kBytes, base, 5));
  EXPECT_EQ(ucx_calls::Calls("ucp_put_nbx"), 0u) << "a write went through UCX's put";
  sender->Close();
  EXPECT_TRUE(receiver->Deregister(shared.region).ok());
}

// A child process that sleeps until killed (it calls nothing but pause: this process has
// threads), to stand as a peer's owner.
pid_t SleepingChild() {
  const pid_t pid = fork();
  if (pid == 0) {
    while (true) pause();
  }
  return pid;
}

// The identity of a child process that has exited and been reaped.
v1::ProcessIdentity ExitedProcess() {
  const pid_t child = SleepingChild();
  if (child <= 0) return v1::ProcessIdentity();
  const v1::ProcessIdentity gone = ProcessIdentityOf(child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return gone;
}

// Over shared memory a peer's segment stays mapped here when the peer dies, so stores into it
// cannot fail: the flush fails instead once the process that published the descriptor (its
// owner) has exited, naming it, and every later flush does too. Before, both flushed OK.
TEST(UcxTransportTest, AFlushIntoAPeerWhoseProcessExitedFailsNamingItOverSharedMemory) {
  constexpr uint64_t kBytes = kMiB;
  std::vector<uint8_t> source(kBytes);
  Fill(source, 3);
  const pid_t child = SleepingChild();
  ASSERT_GT(child, 0);
  auto sender = UcxTransport::Create(Sm()).value();
  auto receiver = UcxTransport::Create(Sm()).value();
  const RegionId src = sender->Register({source.data(), source.size()}).value();
  SharedRegion shared = receiver->Allocate(kBytes).value();
  v1::HandshakeDescriptor descriptor = receiver->LocalDescriptor().value();
  ASSERT_EQ(descriptor.owner().pid(), static_cast<uint32_t>(getpid()));
  *descriptor.mutable_owner() = ProcessIdentityOf(child);  // the child stands as the owner
  const PeerId peer = sender->Connect(descriptor).value();
  const uint64_t base = reinterpret_cast<uintptr_t>(shared.base);
  const Write write{.local_offset = 0, .remote_address = base, .length = kBytes};
  Waiter alive;
  ASSERT_TRUE(sender->PostWrites(peer, 0, src, {&write, 1}, alive.Callback()).ok());
  ASSERT_TRUE(sender->Flush(peer, 0, alive.Callback()).ok());
  ASSERT_TRUE(alive.Wait().ok());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (int round = 0; round < 2; ++round) {
    Waiter batch, flush;
    ASSERT_TRUE(sender->PostWrites(peer, 0, src, {&write, 1}, batch.Callback()).ok());
    ASSERT_TRUE(sender->Flush(peer, 0, flush.Callback()).ok());
    EXPECT_TRUE(batch.Wait().ok());  // the stores themselves never fail
    const absl::Status flushed = flush.Wait();
    EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
    EXPECT_NE(flushed.message().find(absl::StrCat("process (pid ", child, ") has exited")),
              std::string::npos)
        << flushed;
  }
  sender->Close();
  EXPECT_TRUE(receiver->Deregister(shared.region).ok());
}

// A descriptor whose owner had exited before Connect (a stale one): Connect fails, naming the
// process.
TEST(UcxTransportTest, ConnectToAPeerWhoseProcessHadExitedFailsOverSharedMemory) {
  const v1::ProcessIdentity gone = ExitedProcess();
  ASSERT_NE(gone.pid(), 0u);
  auto sender = UcxTransport::Create(Sm()).value();
  auto receiver = UcxTransport::Create(Sm()).value();
  SharedRegion shared = receiver->Allocate(kMiB).value();
  v1::HandshakeDescriptor descriptor = receiver->LocalDescriptor().value();
  *descriptor.mutable_owner() = gone;
  const absl::StatusOr<PeerId> peer = sender->Connect(descriptor);
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_NE(peer.status().message().find("has exited"), std::string::npos) << peer.status();
  sender->Close();
  EXPECT_TRUE(receiver->Deregister(shared.region).ok());
}

// Over tcp nothing proves that a peer is on this host (a VM cloned while running keeps its boot
// id and pid namespace), so its owner is not watched: a descriptor naming a process that has
// exited connects and flushes as before; a dead peer over tcp resets its connection instead.
TEST(UcxTransportTest, APeerOverTcpIsNotWatchedThoughItsOwnerIsNamed) {
  const v1::ProcessIdentity gone = ExitedProcess();
  ASSERT_NE(gone.pid(), 0u);
  std::vector<uint8_t> source(kMiB, 7);
  std::vector<uint8_t> destination(kMiB, 0);
  auto sender = UcxTransport::Create(Tcp()).value();
  auto receiver = UcxTransport::Create(Tcp()).value();
  const RegionId src = sender->Register({source.data(), source.size()}).value();
  ASSERT_TRUE(receiver->Register({destination.data(), destination.size()}).ok());
  v1::HandshakeDescriptor descriptor = receiver->LocalDescriptor().value();
  *descriptor.mutable_owner() = gone;
  const PeerId peer = sender->Connect(descriptor).value();
  const Write write{.local_offset = 0,
                    .remote_address = reinterpret_cast<uintptr_t>(destination.data()),
                    .length = kMiB};
  Waiter waiter;
  ASSERT_TRUE(sender->PostWrites(peer, 0, src, {&write, 1}, waiter.Callback()).ok());
  ASSERT_TRUE(sender->Flush(peer, 0, waiter.Callback()).ok());
  EXPECT_TRUE(waiter.Wait().ok());
  EXPECT_EQ(destination, source);
  sender->Close();
  receiver->Close();
}

// Strided writes (head-sliced pages) into a peer's shared segment are stores too, row by row
// from the one description: every row lands, the bytes between rows stay zero, and no put is
// made.
TEST(UcxTransportTest, StridedWritesIntoAPeersSharedSegmentAreStoresRowByRow) {
  constexpr uint64_t kRow = 1024;
  constexpr uint64_t kRows = 16;
  constexpr uint64_t kPages = 128;
  std::vector<uint8_t> source(kPages * kRows * kRow);
  Fill(source, 12);
  auto sender = UcxTransport::Create(Sm()).value();
  auto receiver = UcxTransport::Create(Sm()).value();
  const RegionId src = sender->Register({source.data(), source.size()}).value();
  SharedRegion shared = receiver->Allocate(2 * source.size()).value();
  ASSERT_EQ(shared.placement, "ucx-shm");
  auto* destination = static_cast<uint8_t*>(shared.base);
  std::memset(destination, 0, 2 * source.size());
  const PeerId peer = sender->Connect(receiver->LocalDescriptor().value()).value();
  const uint64_t base = reinterpret_cast<uintptr_t>(shared.base);
  std::vector<Write> writes;
  for (uint64_t p = 0; p < kPages; ++p) {
    writes.push_back(Write{.local_offset = p * kRows * kRow,
                           .remote_address = base + 2 * p * kRows * kRow + kRow,
                           .length = kRow,
                           .rows = kRows,
                           .local_stride = kRow,
                           .remote_stride = 2 * kRow});
  }
  ucx_calls::ResetCalls();
  std::promise<absl::Status> posted, flushed;
  ASSERT_TRUE(
      sender
          ->PostWrites(peer, 0, src, writes, [&](absl::Status status) { posted.set_value(status); })
          .ok());
  ASSERT_TRUE(sender->Flush(peer, 0, [&](absl::Status status) { flushed.set_value(status); }).ok());
  ASSERT_TRUE(posted.get_future().get().ok());
  ASSERT_TRUE(flushed.get_future().get().ok());
  EXPECT_EQ(ucx_calls::Calls("ucp_put_nbx"), 0u) << "a row went through UCX's put";
  for (uint64_t p = 0; p < kPages; ++p) {
    for (uint64_t r = 0; r < kRows; ++r) {
      const uint8_t* row = destination + (2 * p * kRows + 2 * r) * kRow;
      ASSERT_TRUE(std::all_of(row, row + kRow, [](uint8_t b) { return b == 0; }))
          << "page " << p << " before row " << r;
      ASSERT_EQ(std::memcmp(row + kRow, &source[(p * kRows + r) * kRow], kRow), 0)
          << "page " << p << " row " << r;
    }
  }
  sender->Close();
  EXPECT_TRUE(receiver->Deregister(shared.region).ok());
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
  EXPECT_TRUE(caps.strided_writes);
  EXPECT_FALSE(caps.gpu_memory);
  EXPECT_EQ(caps.max_write_bytes, 4 * kMiB);
  // The scheduler is advised 1 MiB over shared memory only, 4 MiB over tcp only, 64 MiB where UCX
  // may choose RDMA; a bound given wins.
  EXPECT_EQ(caps.max_inflight_bytes_per_endpoint, 1 * kMiB);
  EXPECT_EQ(UcxTransport::Create(Tcp()).value()->capabilities().max_inflight_bytes_per_endpoint,
            4 * kMiB);
  EXPECT_EQ(InflightBytesPerEndpoint({.tls = "rc,sm,self"}), 64 * kMiB);
  EXPECT_EQ(InflightBytesPerEndpoint({}), 64 * kMiB);
  UcxOptions given = Sm();
  given.max_inflight_bytes_per_endpoint = 8 * kMiB;
  EXPECT_EQ(UcxTransport::Create(given).value()->capabilities().max_inflight_bytes_per_endpoint,
            8 * kMiB);
  EXPECT_TRUE(SharedMemoryOnly("sm,self"));
  EXPECT_TRUE(SharedMemoryOnly("posix,cma"));
  EXPECT_FALSE(SharedMemoryOnly("sm,tcp"));
  EXPECT_FALSE(SharedMemoryOnly(""));
  EXPECT_TRUE(TcpOnly("tcp"));
  EXPECT_TRUE(TcpOnly("tcp,sm,self"));
  EXPECT_FALSE(TcpOnly("sm,self"));
  EXPECT_FALSE(TcpOnly("rc,tcp"));
  // Rows landing apart are placed whole over shared memory or tcp alone, a put each over RDMA.
  EXPECT_TRUE(caps.lands_rows_apart_whole);
  EXPECT_TRUE(UcxTransport::Create(Tcp()).value()->capabilities().lands_rows_apart_whole);
  EXPECT_TRUE(caps.lanes_share_rows);
  EXPECT_FALSE(UcxTransport::Create(Tcp()).value()->capabilities().lanes_share_rows);
  // Over tcp the target's lane thread copies each message in; over shared memory the writer's
  // lane stores the bytes itself.
  EXPECT_FALSE(caps.peer_lanes_receive);
  EXPECT_TRUE(UcxTransport::Create(Tcp()).value()->capabilities().peer_lanes_receive);
  // A writer can be refused where the target's lanes land its writes (tcp), not where it stores
  // them itself (shared memory).
  EXPECT_FALSE(caps.refuses_writers);
  EXPECT_TRUE(UcxTransport::Create(Tcp()).value()->capabilities().refuses_writers);
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

// A prefill of the smaller TP's rows over tcp: 1 KiB of every 2 KiB source row, which a lane
// packs before sending (am_protocol.h). 64 MiB of them posted at once on every lane, so that the
// socket fills and some sends wait in UCX while later ones go at once: a message sent at once
// leaves its packed bytes to the next one (IssueAmWrites), and one that waits keeps its own.
// Every byte lands where it should, and nothing past the rows.
TEST(UcxTransportTest, PackedRowsLandExactlyWhileTheSocketIsFullOverTcp) {
  constexpr uint64_t kRow = 1024;
  constexpr uint64_t kRowsPerWrite = 64;
  constexpr uint64_t kRows = 64 * kMiB / kRow;
  Link link(Tcp(), 2 * kRows * kRow);
  Fill(link.source, 11);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  const int lanes = sender->capabilities().lanes;
  Waiter posted;
  std::vector<Write> writes;
  for (uint64_t r = 0; r < kRows; r += kRowsPerWrite) {
    writes.push_back(Write{.local_offset = r * 2 * kRow,
                           .remote_address = base + r * kRow,
                           .length = kRow,
                           .rows = kRowsPerWrite,
                           .local_stride = 2 * kRow,
                           .remote_stride = kRow});
    if (writes.size() == 256 || r + kRowsPerWrite == kRows) {
      const int lane = static_cast<int>(r / kRowsPerWrite / 256) % lanes;
      ASSERT_TRUE(sender->PostWrites(peer, lane, src, writes, posted.Callback()).ok());
      writes.clear();
    }
  }
  for (int lane = 0; lane < lanes; ++lane) {
    ASSERT_TRUE(sender->Flush(peer, lane, posted.Callback()).ok());
  }
  ASSERT_TRUE(posted.Wait().ok());
  for (uint64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(std::memcmp(&destination[r * kRow], &source[2 * r * kRow], kRow), 0) << "row " << r;
  }
  EXPECT_TRUE(std::all_of(destination.begin() + kRows * kRow, destination.end(),
                          [](uint8_t b) { return b == 0; }));
}

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

// An idle lane sleeps until something wakes it, and counts what did (transport_counters): a
// queued job wakes the sender's lane, and over tcp the peer's message wakes the receiver's lane
// through its worker's event fd (UCP_FEATURE_WAKEUP), not the end of its nap. Each round leaves
// every lane idle for 20 ms first, so each is asleep when the round begins.
TEST(UcxTransportTest, AnIdleLaneIsWokenByAJobAndOverTcpByThePeersMessage) {
  Link link(Tcp(), kMiB);
  Fill(link.source, 5);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Waiter done;
    const std::vector<Write> writes = {{0, base, kMiB}};
    ASSERT_TRUE(sender->PostWrites(peer, 0, src, writes, done.Callback()).ok());
    ASSERT_TRUE(sender->Flush(peer, 0, done.Callback()).ok());
    ASSERT_TRUE(done.Wait().ok());
  }
  EXPECT_EQ(std::memcmp(source.data(), destination.data(), kMiB), 0);
  const TransportCounters sent = sender->transport_counters();
  const TransportCounters received = receiver->transport_counters();
  EXPECT_GE(sent.lane_wakes_by_job, 1u);
  EXPECT_GE(received.lane_wakes_by_event, 1u);
  // Lane 1 of each side had nothing to do: its naps ran out.
  EXPECT_GE(sent.lane_naps_ended, 1u);
  EXPECT_GE(received.lane_naps_ended, 1u);
}

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

// A head-sliced room's shape over tcp, where small writes share messages (kWritesAm): thousands
// of writes of every size from 1 byte to 2 KiB, scattered over the destination in shuffled order
// among a few large ones, over both lanes; every byte lands where it belongs, no other changes.
// (Over shared memory this runs as WritesIntoAPeersSharedSegmentAreStoresThatLandExactly. On
// every backend, in the conformance suite, it made a later shared-memory close test crash inside
// UCX's worker teardown one run in two or four, with this stop's transport code and the one
// before it alike: ucp_worker_destroy -> uct_mm_ep_pending_purge -> ucp_mem_rereg_mds. Not
// understood yet, so it is not there.)
TEST(UcxTransportTest, ManySmallScatteredWritesLandExactlyOverTcp) {
  constexpr uint64_t kBytes = 8 * kMiB;
  Link link(Tcp(), kBytes);
  Fill(link.source, 23);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  PostAndCheck(*sender, peer, src, source, destination.data(), base,
               ScatteredWrites(kBytes, base, 23));
}

// Over tcp small writes share messages (kWritesAm); the target still checks each one: a message
// mixing writes into a region it still holds with writes into one it has deregistered lands
// the first and refuses the others, and the next Flush names a refused write.
// Posts `writes` and a flush on `lane`; the flush's outcome.
absl::Status WriteAndFlush(UcxTransport& sender, PeerId peer, int lane, RegionId src,
                           const std::vector<Write>& writes) {
  Waiter waiter;
  std::mutex mu;
  absl::Status flushed;
  EXPECT_TRUE(sender.PostWrites(peer, lane, src, writes, waiter.Callback()).ok());
  Completion flush = waiter.Callback();
  EXPECT_TRUE(sender
                  .Flush(peer, lane,
                         [&, flush](absl::Status status) {
                           {
                             std::lock_guard<std::mutex> lock(mu);
                             flushed = status;
                           }
                           flush(status);
                         })
                  .ok());
  (void)waiter.Wait();
  std::lock_guard<std::mutex> lock(mu);
  return flushed;
}

TEST(UcxTransportTest, APackedMessageRefusesEachWriteOutsideTheTargetsRegions) {
  std::vector<uint8_t> source(64 * 1024), kept(64 * 1024), dropped(64 * 1024);
  Fill(source, 3);
  auto sender = UcxTransport::Create(Tcp()).value();
  auto receiver = UcxTransport::Create(Tcp()).value();
  const RegionId src = sender->Register({source.data(), source.size()}).value();
  ASSERT_TRUE(receiver->Register({kept.data(), kept.size()}).ok());
  const RegionId gone = receiver->Register({dropped.data(), dropped.size()}).value();
  const PeerId peer = sender->Connect(receiver->LocalDescriptor().value()).value();
  ASSERT_TRUE(receiver->Deregister(gone).ok());  // the sender's descriptor still names it
  const uint64_t kept_base = reinterpret_cast<uintptr_t>(kept.data());
  const uint64_t dropped_base = reinterpret_cast<uintptr_t>(dropped.data());
  std::vector<Write> writes;
  for (uint64_t i = 0; i < 32; ++i) {
    writes.push_back({i * 1024, kept_base + i * 1024, 1024});
    writes.push_back({i * 1024, dropped_base + i * 1024, 1024});
  }
  ucx_calls::ResetCalls();
  const absl::Status flushed = WriteAndFlush(*sender, peer, 0, src, writes);
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  EXPECT_NE(flushed.message().find("the peer refused a write of 1024 bytes at 0x"),
            std::string::npos)
      << flushed;
  // 64 rows of a KiB: two messages (a segment holds under 64 KiB) and the flush, not one each.
  EXPECT_LE(ucx_calls::Calls("ucp_am_send_nbx"), 5u);
  EXPECT_EQ(std::memcmp(kept.data(), source.data(), 32 * 1024), 0);
  EXPECT_TRUE(std::all_of(dropped.begin(), dropped.end(), [](uint8_t b) { return b == 0; }));
}

// A decode that found a prefill gone refuses what it sent before it went (RefuseWriter): on
// every lane, whatever the target reads of those connections from then on lands nowhere, and the
// writer's flush says why; another writer's and a later connection of the same name land.
TEST(UcxTransportTest, ARefusedWriterLandsNothingMoreOnAnyLaneOverTcp) {
  std::vector<uint8_t> source(64 * 1024), destination(64 * 1024);
  Fill(source, 5);
  UcxOptions named = Tcp();
  named.writer_name = "tcp://10.9.0.1:7000";
  auto gone = UcxTransport::Create(named).value();
  auto other = UcxTransport::Create(Tcp()).value();
  auto receiver = UcxTransport::Create(Tcp()).value();
  ASSERT_TRUE(receiver->capabilities().refuses_writers);
  const RegionId gone_src = gone->Register({source.data(), source.size()}).value();
  const RegionId other_src = other->Register({source.data(), source.size()}).value();
  ASSERT_TRUE(receiver->Register({destination.data(), destination.size()}).ok());
  const v1::HandshakeDescriptor d = receiver->LocalDescriptor().value();
  const PeerId to_gone = gone->Connect(d).value();
  const PeerId to_other = other->Connect(d).value();
  const uint64_t base = reinterpret_cast<uintptr_t>(destination.data());
  // Landed before the refusal, on both lanes (each has a hello by now: it came first).
  for (int lane = 0; lane < 2; ++lane) {
    ASSERT_TRUE(WriteAndFlush(*gone, to_gone, lane, gone_src,
                              {{uint64_t(lane) * 1024, base + lane * 1024, 1024}})
                    .ok());
  }
  EXPECT_EQ(receiver->RefuseWriter("tcp://10.9.0.2:7000").value(), 0u);  // nobody of that name
  EXPECT_EQ(receiver->RefuseWriter("tcp://10.9.0.1:7000").value(), 2u);  // its two lanes
  for (int lane = 0; lane < 2; ++lane) {
    // A single write, a packed one, rows: each refused whole.
    const std::vector<Write> writes = {
        {4096, base + 4096 + lane * 8192, 1024},
        {8192, base + 8192 + lane * 8192, 64},
        {8256, base + 8320 + lane * 8192, 64},
        {12288, base + 16384 + lane * 8192, 256, 4, 512, 1024},
    };
    const absl::Status refused = WriteAndFlush(*gone, to_gone, lane, gone_src, writes);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_THAT(refused.message(), testing::HasSubstr("refuses this writer")) << refused;
  }
  EXPECT_EQ(std::memcmp(destination.data(), source.data(), 2048), 0);
  EXPECT_TRUE(
      std::all_of(destination.begin() + 2048, destination.end(), [](uint8_t b) { return b == 0; }));
  // Another writer lands, and so does the same name on a new connection (a restarted rank).
  ASSERT_TRUE(WriteAndFlush(*other, to_other, 1, other_src, {{32768, base + 32768, 1024}}).ok());
  auto back = UcxTransport::Create(named).value();
  const RegionId back_src = back->Register({source.data(), source.size()}).value();
  const PeerId to_back = back->Connect(d).value();
  ASSERT_TRUE(WriteAndFlush(*back, to_back, 0, back_src, {{40960, base + 40960, 1024}}).ok());
  EXPECT_EQ(std::memcmp(destination.data() + 32768, source.data() + 32768, 1024), 0);
  EXPECT_EQ(std::memcmp(destination.data() + 40960, source.data() + 40960, 1024), 0);
}

// Over shared memory a writer stores into the target's pages itself: nothing passes through the
// target's code to refuse.
TEST(UcxTransportTest, OverSharedMemoryNoWriterIsRefused) {
  UcxOptions named = Sm();
  named.writer_name = "tcp://10.9.0.1:7000";
  auto sender = UcxTransport::Create(named).value();
  auto receiver = UcxTransport::Create(Sm()).value();
  EXPECT_FALSE(receiver->capabilities().refuses_writers);
  std::vector<uint8_t> bytes(4096);
  ASSERT_TRUE(receiver->Register({bytes.data(), bytes.size()}).ok());
  ASSERT_TRUE(sender->Connect(receiver->LocalDescriptor().value()).ok());
  EXPECT_EQ(receiver->RefuseWriter("tcp://10.9.0.1:7000").value(), 0u);
  receiver->Close();
  EXPECT_EQ(receiver->RefuseWriter("tcp://10.9.0.1:7000").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Opens once, at Open or at the latest when it goes (so a failed test never leaves a lane's
// thread waiting in a completion).
class Latch {
 public:
  ~Latch() { Open(); }
  void Open() {
    std::call_once(once_, [this] { open_.set_value(); });
  }
  // Ready once it opens; a copy of its own for each waiter, which may outlive the latch.
  std::shared_future<void> Opened() const { return opened_; }

 private:
  std::once_flag once_;
  std::promise<void> open_;
  std::shared_future<void> opened_ = open_.get_future().share();
};

bool AllZero(const uint8_t* bytes, uint64_t length) {
  return std::all_of(bytes, bytes + length, [](uint8_t b) { return b == 0; });
}

// Holds lane 0's thread inside a completion until `latch` opens: returns once it is inside.
void HoldLane0(Link& link, const Latch& latch) {
  auto entered = std::make_shared<std::promise<void>>();
  std::future<void> inside = entered->get_future();
  const std::vector<Write> first = {{0, link.base, 4096}};
  ASSERT_TRUE(link.sender
                  ->PostWrites(link.peer, 0, link.src, first,
                               [entered, opened = latch.Opened()](absl::Status) {
                                 entered->set_value();
                                 opened.wait_for(std::chrono::seconds(60));
                               })
                  .ok());
  ASSERT_EQ(inside.wait_for(std::chrono::seconds(30)), std::future_status::ready);
}

// The lane's thread alone issues its writes: while it is held inside a completion, a post and a
// flush on its lane (from this thread, and from lane 1's completion) return at once, and
// nothing they carry leaves until the thread is free again; then all of it lands, in order.
void PostsQueueWhileTheLanesThreadIsBusy(const UcxOptions& options) {
  Link link(options, kMiB);
  Fill(link.source, 5);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  Latch latch;
  HoldLane0(link, latch);
  if (testing::Test::HasFatalFailure()) return;
  Waiter later;
  const uint64_t half = kMiB / 2;
  const std::vector<Write> second = {{half, base + half, half / 2}};
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sender->PostWrites(peer, 0, src, second, later.Callback()).ok());
  ASSERT_TRUE(sender->Flush(peer, 0, later.Callback()).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // From another lane's thread too: lane 1's completion posts and flushes on lane 0.
  std::promise<bool> from_lane1;
  std::future<bool> lane1_posted = from_lane1.get_future();
  const std::vector<Write> third = {{half + half / 2, base + half + half / 2, half / 2}};
  Completion third_done = later.Callback();
  Completion third_flushed = later.Callback();
  ASSERT_TRUE(sender
                  ->PostWrites(peer, 1, src, {{0, base + 4096, 4096}},
                               [&from_lane1, &third, &third_done, &third_flushed,
                                raw = sender.get(), to = peer, from = src](absl::Status) {
                                 from_lane1.set_value(
                                     raw->PostWrites(to, 0, from, third, third_done).ok() &&
                                     raw->Flush(to, 0, third_flushed).ok());
                               })
                  .ok());
  ASSERT_EQ(lane1_posted.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(lane1_posted.get());
  // Given time to land, had anyone but lane 0's thread sent them: none did.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(later.Completed(), 0);
  EXPECT_TRUE(AllZero(destination.data() + half, half));
  latch.Open();
  ASSERT_TRUE(later.Wait().ok());
  EXPECT_EQ(std::memcmp(source.data() + half, destination.data() + half, half), 0);
}

TEST(UcxTransportTest, PostsQueueWhileTheLanesThreadIsBusyOverSharedMemory) {
  PostsQueueWhileTheLanesThreadIsBusy(Sm());
}

TEST(UcxTransportTest, PostsQueueWhileTheLanesThreadIsBusyOverTcp) {
  PostsQueueWhileTheLanesThreadIsBusy(Tcp());
}

// What waits in a lane's queue when its source is deregistered, or its peer disconnected, is
// cancelled, never sent; neither call waits for the lane's thread.
void QueuedWorkIsCancelledNotSent(const UcxOptions& options) {
  Link link(options, kMiB);
  Fill(link.source, 9);
  auto& [source, destination, sender, receiver, src, peer, base] = link;
  std::vector<uint8_t> other(kMiB);
  Fill(other, 11);
  const RegionId other_src = sender->Register({other.data(), other.size()}).value();
  std::mutex mu;
  std::vector<absl::Status> statuses;
  Waiter all;
  const auto record = [&](Completion done) {
    return [&, done](absl::Status s) {
      {
        std::lock_guard<std::mutex> lock(mu);
        statuses.push_back(s);
      }
      done(s);
    };
  };
  const uint64_t half = kMiB / 2;
  {
    Latch latch;
    HoldLane0(link, latch);
    if (testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(
        sender->PostWrites(peer, 0, other_src, {{0, base + half, 4096}}, record(all.Callback()))
            .ok());
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(sender->Deregister(other_src).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  }
  EXPECT_EQ(all.Wait().code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kCancelled) << statuses[0];
  EXPECT_NE(statuses[0].message().find("source region was deregistered"), std::string::npos)
      << statuses[0];
  {
    Latch latch;
    HoldLane0(link, latch);
    if (testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(sender
                    ->PostWrites(peer, 0, src, {{half, base + half + 4096, half - 4096}},
                                 record(all.Callback()))
                    .ok());
    ASSERT_TRUE(sender->Flush(peer, 0, record(all.Callback())).ok());
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(sender->Disconnect(peer).ok());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  }
  all.Wait().IgnoreError();
  ASSERT_EQ(statuses.size(), 3u);
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  }
  EXPECT_NE(statuses[1].message().find("disconnected"), std::string::npos) << statuses[1];
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(AllZero(destination.data() + half, half));
}

TEST(UcxTransportTest, QueuedWorkIsCancelledNotSentOverSharedMemory) {
  QueuedWorkIsCancelledNotSent(Sm());
}

TEST(UcxTransportTest, QueuedWorkIsCancelledNotSentOverTcp) { QueuedWorkIsCancelledNotSent(Tcp()); }

// A prefill of the smaller TP over shared memory: one sender, two decode ranks' segments, each
// rank's writes its half of every 2 KiB source row (decision 0020).
struct TwoHalves {
  static constexpr uint64_t kRow = 1024;  // a rank's half of a source row
  static constexpr uint64_t kRows = 16;   // a write's rows (a page)
  static constexpr uint64_t kPages = 64;
  static constexpr uint64_t kBytes = kPages * kRows * 2 * kRow;

  TwoHalves() : source(kBytes) {
    Fill(source, 21);
    sender = UcxTransport::Create(Sm()).value();
    src = sender->Register({source.data(), source.size()}).value();
    for (int rank = 0; rank < 2; ++rank) {
      receivers[rank] = UcxTransport::Create(Sm()).value();
      segments[rank] = receivers[rank]->Allocate(kBytes / 2).value();
      std::memset(segments[rank].base, 0, kBytes / 2);
      peers[rank] = sender->Connect(receivers[rank]->LocalDescriptor().value()).value();
    }
  }
  ~TwoHalves() {
    sender->Close();
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(receivers[rank]->Deregister(segments[rank].region).ok());
    }
  }
  // Rank `rank`'s writes of pages [first, end): its half of each row, back to back in its pages.
  std::vector<Write> Writes(int rank, uint64_t first, uint64_t end) const {
    std::vector<Write> writes;
    const uint64_t base = reinterpret_cast<uintptr_t>(segments[rank].base);
    for (uint64_t p = first; p < end; ++p) {
      writes.push_back(Write{.local_offset = p * kRows * 2 * kRow + rank * kRow,
                             .remote_address = base + p * kRows * kRow,
                             .length = kRow,
                             .rows = kRows,
                             .local_stride = 2 * kRow,
                             .remote_stride = kRow});
    }
    return writes;
  }
  // Every byte of both ranks' pages: each its half of every source row.
  void ExpectLanded() const {
    for (int rank = 0; rank < 2; ++rank) {
      const auto* pages = static_cast<const uint8_t*>(segments[rank].base);
      for (uint64_t row = 0; row < kPages * kRows; ++row) {
        ASSERT_EQ(std::memcmp(pages + row * kRow, &source[row * 2 * kRow + rank * kRow], kRow), 0)
            << "rank " << rank << " row " << row;
      }
    }
  }
  // Holds lane 0's thread inside a completion (as HoldLane0) until `latch` opens.
  void HoldLane0(const Latch& latch) {
    auto entered = std::make_shared<std::promise<void>>();
    std::future<void> inside = entered->get_future();
    ASSERT_TRUE(sender
                    ->PostWrites(peers[0], 0, src, Writes(0, 0, 1),
                                 [entered, opened = latch.Opened()](absl::Status) {
                                   entered->set_value();
                                   opened.wait_for(std::chrono::seconds(60));
                                 })
                    .ok());
    ASSERT_EQ(inside.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  }

  std::vector<uint8_t> source;
  std::unique_ptr<UcxTransport> sender;
  std::unique_ptr<UcxTransport> receivers[2];
  SharedRegion segments[2];
  PeerId peers[2] = {};
  RegionId src = 0;
};

// Batches of two peers taken in one round, whose writes read the two halves of the same rows, are
// stored a source row at a time: every write of both, none through UCX's put, every byte exact.
TEST(UcxTransportTest, TwoPeersHalvesOfTheSameRowsAreStoredTogetherOverSharedMemory) {
  TwoHalves f;
  Waiter all;
  {
    Latch latch;
    f.HoldLane0(latch);
    if (testing::Test::HasFatalFailure()) return;
    ucx_calls::ResetCalls();
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(f.sender
                      ->PostWrites(f.peers[rank], 0, f.src,
                                   f.Writes(rank, rank == 0 ? 1 : 0, TwoHalves::kPages),
                                   all.Callback())
                      .ok());
      ASSERT_TRUE(f.sender->Flush(f.peers[rank], 0, all.Callback()).ok());
    }
  }
  ASSERT_TRUE(all.Wait().ok());
  EXPECT_EQ(ucx_calls::Calls("ucp_put_nbx"), 0u);
  // Rank 1's first page had no rank 0 write beside it in the round (rank 0's was the hold's).
  EXPECT_EQ(f.sender->transport_counters().writes_stored_together, 2 * (TwoHalves::kPages - 1));
  f.ExpectLanded();
}

// A shared pass stores only what Issue would send: of two peers' batches of the same rows queued
// together, the one whose peer was disconnected meanwhile is cancelled and none of its bytes
// land; the other lands alone, every byte, and nothing was stored together.
TEST(UcxTransportTest, ASharedPassLeavesADisconnectedPeersBatchUnsentOverSharedMemory) {
  TwoHalves f;
  std::mutex mu;
  std::vector<absl::Status> outcomes(2);
  Waiter all;
  {
    Latch latch;
    f.HoldLane0(latch);
    if (testing::Test::HasFatalFailure()) return;
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(f.sender
                      ->PostWrites(f.peers[rank], 0, f.src, f.Writes(rank, 1, TwoHalves::kPages),
                                   [&, rank, done = all.Callback()](absl::Status status) {
                                     {
                                       std::lock_guard<std::mutex> lock(mu);
                                       outcomes[rank] = status;
                                     }
                                     done(status);
                                   })
                      .ok());
    }
    ASSERT_TRUE(f.sender->Disconnect(f.peers[1]).ok());
  }
  all.Wait().IgnoreError();
  EXPECT_TRUE(outcomes[0].ok()) << outcomes[0];
  EXPECT_EQ(outcomes[1].code(), absl::StatusCode::kCancelled) << outcomes[1];
  EXPECT_EQ(f.sender->transport_counters().writes_stored_together, 0u);
  Waiter flushed;
  ASSERT_TRUE(f.sender->Flush(f.peers[0], 0, flushed.Callback()).ok());
  ASSERT_TRUE(flushed.Wait().ok());
  const auto* rank0 = static_cast<const uint8_t*>(f.segments[0].base);
  for (uint64_t row = 0; row < TwoHalves::kPages * TwoHalves::kRows; ++row) {
    ASSERT_EQ(std::memcmp(rank0 + row * TwoHalves::kRow, &f.source[row * 2 * TwoHalves::kRow],
                          TwoHalves::kRow),
              0)
        << "rank 0 row " << row;
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(AllZero(static_cast<const uint8_t*>(f.segments[1].base), TwoHalves::kBytes / 2));
}

// A peer's batch a round ahead of the other's waits one round for it: rank 0 posts its second
// page's batch while rank 1's first is still queued, and rank 1's second is posted by its first's
// completion; rank 0's waits, then both second pages are stored together.
TEST(UcxTransportTest, ABatchAheadOfAnotherPeersWaitsARoundForItOverSharedMemory) {
  TwoHalves f;
  Waiter all;
  std::promise<bool> second_posted;
  {
    Latch latch;
    f.HoldLane0(latch);
    if (testing::Test::HasFatalFailure()) return;
    const uint64_t half = TwoHalves::kPages / 2;
    ASSERT_TRUE(f.sender
                    ->PostWrites(f.peers[1], 0, f.src, f.Writes(1, 0, half),
                                 [&, done = all.Callback()](absl::Status status) {
                                   second_posted.set_value(
                                       f.sender
                                           ->PostWrites(f.peers[1], 0, f.src,
                                                        f.Writes(1, half, TwoHalves::kPages),
                                                        all.Callback())
                                           .ok());
                                   done(status);
                                 })
                    .ok());
    ASSERT_TRUE(
        f.sender
            ->PostWrites(f.peers[0], 0, f.src, f.Writes(0, half, TwoHalves::kPages), all.Callback())
            .ok());
  }
  ASSERT_TRUE(second_posted.get_future().get());
  ASSERT_TRUE(all.Wait().ok());
  EXPECT_EQ(f.sender->transport_counters().writes_stored_together, TwoHalves::kPages);
  // Rank 0's first half of the pages was the hold's page alone: the rest, for the check.
  Waiter rest;
  ASSERT_TRUE(
      f.sender
          ->PostWrites(f.peers[0], 1, f.src, f.Writes(0, 1, TwoHalves::kPages / 2), rest.Callback())
          .ok());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(f.sender->Flush(f.peers[rank], 0, rest.Callback()).ok());
    ASSERT_TRUE(f.sender->Flush(f.peers[rank], 1, rest.Callback()).ok());
  }
  ASSERT_TRUE(rest.Wait().ok());
  f.ExpectLanded();
}

// Connect, posts and flushes from this thread and from completions, Register, Deregister,
// Disconnect and Close: every UCX call they lead to is made by the worker's own lane thread
// (ucx_calls, above), none on the caller's.
void NoUcxCallOnACallersThread(const UcxOptions& options, const char* write_call) {
  const size_t strays_before = ucx_calls::Strays().size();
  ucx_calls::ResetCalls();
  {
    Link link(options, 4 * kMiB);
    Fill(link.source, 13);
    auto& [source, destination, sender, receiver, src, peer, base] = link;
    Waiter all;
    for (int lane = 0; lane < 2; ++lane) {
      const uint64_t at = lane * kMiB;
      ASSERT_TRUE(
          sender->PostWrites(peer, lane, src, {{at, base + at, kMiB}}, all.Callback()).ok());
      // The completion posts and flushes on the other lane.
      Completion posted = all.Callback();
      Completion flushed = all.Callback();
      const uint64_t next = (2 + lane) * kMiB;
      ASSERT_TRUE(
          sender
              ->Flush(peer, lane,
                      [raw = sender.get(), to = peer, from = src, at = base + next, lane, next,
                       posted, flushed](absl::Status s) {
                        EXPECT_TRUE(s.ok()) << s;
                        EXPECT_TRUE(
                            raw->PostWrites(to, 1 - lane, from, {{next, at, kMiB}}, posted).ok());
                        EXPECT_TRUE(raw->Flush(to, 1 - lane, flushed).ok());
                      })
              .ok());
    }
    ASSERT_TRUE(all.Wait().ok());
    EXPECT_EQ(std::memcmp(source.data(), destination.data(), source.size()), 0);
    std::vector<uint8_t> more(4096);
    const RegionId region = sender->Register({more.data(), more.size()}).value();
    EXPECT_TRUE(sender->Deregister(region).ok());
    EXPECT_TRUE(sender->Disconnect(peer).ok());
    const PeerId again = sender->Connect(receiver->LocalDescriptor().value()).value();
    Waiter last;
    ASSERT_TRUE(sender->PostWrites(again, 0, src, {{0, base, 4096}}, last.Callback()).ok());
    sender->Close();
    last.Wait().IgnoreError();
  }
  const std::vector<std::string> strays = ucx_calls::Strays();
  EXPECT_EQ(strays.size(), strays_before) << "the first: " << strays[strays_before];
  for (const char* call : {write_call, "ucp_ep_create", "ucp_ep_rkey_unpack", "ucp_ep_flush_nbx",
                           "ucp_ep_close_nbx", "ucp_worker_progress", "ucp_worker_destroy"}) {
    EXPECT_GT(ucx_calls::Calls(call), 0u) << call << " was not seen: is it still wrapped?";
  }
}

TEST(UcxTransportTest, NoUcxCallOnACallersThreadOverSharedMemory) {
  NoUcxCallOnACallersThread(Sm(), "ucp_put_nbx");
}

TEST(UcxTransportTest, NoUcxCallOnACallersThreadOverTcp) {
  NoUcxCallOnACallersThread(Tcp(), "ucp_am_send_nbx");
}

}  // namespace
}  // namespace kvrail::transport
