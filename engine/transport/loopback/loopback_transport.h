// An in-process Transport for tests: each write is a memcpy on the transport's progress thread,
// and every completion comes from that thread, with the same contract as the real backends
// (engine/transport/transport.h).
//
// Remote keys name a (transport, region) pair in a process-wide registry rather than a raw
// pointer, so a write into a region that was deregistered, or whose transport was closed, fails
// with kUnavailable instead of touching freed memory. Each write pins both its regions for the
// length of its memcpy; Deregister and Close wait for those pins to drain.
//
// The progress thread runs one queue per transport in posting order, so a Flush completes
// after every batch posted before it. Fault hooks let tests fail writes, hold completions back,
// and kill a peer in the middle of a batch.
//
// Fencing (transport.h): a write has landed when its memcpy returns, before its batch's
// completion. (a) A Flush runs after every batch queued before it, so when it completes, OK or
// not, each earlier write has landed or was skipped and none runs later. (b) Disconnect marks
// the peer before it returns; the progress thread starts no write to a marked peer, and a write
// already copying ends before its batch completes (kCancelled). Close does this for every peer.
#ifndef KVRAIL_ENGINE_TRANSPORT_LOOPBACK_LOOPBACK_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_LOOPBACK_LOOPBACK_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/memory/arena.h"
#include "engine/transport/bounds.h"
#include "engine/transport/region_table.h"
#include "engine/transport/transport.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

struct LoopbackOptions {
  int lanes = 4;
  uint64_t max_write_bytes = uint64_t{1} << 30;
  uint64_t max_inflight_bytes_per_endpoint = uint64_t{1} << 30;
};

namespace loopback_internal {
struct RegionEntry;
}  // namespace loopback_internal

class LoopbackTransport final : public Transport {
 public:
  // InvalidArgument for lanes < 1 or max_write_bytes == 0. Starts the progress thread.
  static absl::StatusOr<std::unique_ptr<LoopbackTransport>> Create(
      const LoopbackOptions& options = {});

  ~LoopbackTransport() override;
  LoopbackTransport(const LoopbackTransport&) = delete;
  LoopbackTransport& operator=(const LoopbackTransport&) = delete;

  const Capabilities& capabilities() const override { return capabilities_; }
  absl::StatusOr<RegionId> Register(const LocalRegion& region) override;
  // Always the memfd placement (engine/transport/shared_region.h).
  absl::StatusOr<SharedRegion> Allocate(uint64_t length) override;
  absl::Status Deregister(RegionId region) override;
  absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const override;
  absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& peer) override;
  absl::Status PostWrites(PeerId peer, int lane, RegionId source, absl::Span<const Write> writes,
                          Completion done) override;
  absl::Status Flush(PeerId peer, int lane, Completion done) override;
  absl::Status Disconnect(PeerId peer) override;
  void Close() override;

  // Fault hooks, for tests. Each applies to writes the progress thread starts after the call.

  // The next `count` writes fail with kUnavailable without moving a byte. A failed write ends
  // its batch: the batch completes with that status and its later writes are skipped (and do
  // not count).
  void FailNextWrites(int count);

  // Holds every completion back by `delay` after its batch or flush finished. Close and
  // Disconnect cut the wait short and report kCancelled instead of OK.
  void DelayCompletions(absl::Duration delay);

  // After the progress thread has started `writes` more writes, it closes `peer` before it
  // starts the next one, as if the peer's process died mid-batch; later writes into the peer
  // fail with kUnavailable. `peer` must stay alive until then.
  void KillPeerAfterWrites(LoopbackTransport* peer, uint64_t writes);

 private:
  struct Peer;
  struct Job;

  LoopbackTransport(const LoopbackOptions& options, uint64_t id);

  void RunProgress();
  // Moves the bytes of one batch; the batch's status.
  absl::Status RunWrites(Job& job);
  // One write's memcpy, with both regions pinned; its status.
  absl::Status CopyOne(const Job& job, const Write& write, size_t index);
  void Deliver(Job& job, absl::Status status);
  // The fault hooks' part of starting a write: kills the peer when due, and consumes a pending
  // failure (returned as the write's status).
  absl::Status BeforeWrite();
  bool OnProgressThread() const;
  // Both need mu_ held.
  absl::StatusOr<std::shared_ptr<Peer>> FindPeer(PeerId peer, int lane) const;
  absl::Status Enqueue(Job job);

  const uint64_t id_;  // this transport's name in the process-wide registry
  const Capabilities capabilities_;

  // std::mutex rather than absl::Mutex: Debian's libabsl is not built with TSan annotations, so
  // TSan cannot see absl::Mutex's synchronisation and reports false races.
  mutable std::mutex mu_;
  // Signalled (notify_all) on every change of the fields mu_ guards.
  std::condition_variable changed_;
  // Guarded by mu_:
  bool closed_ = false;
  bool revoked_ = false;  // Close has withdrawn every registration
  PeerId next_peer_ = 1;
  // The registrations and the descriptor version (region_table.h).
  RegionTable<std::shared_ptr<loopback_internal::RegionEntry>> regions_;
  std::map<RegionId, std::unique_ptr<Arena>> allocated_;  // Allocate's memory, freed at Deregister
  absl::flat_hash_map<PeerId, std::shared_ptr<Peer>> peers_;
  std::deque<Job> queue_;
  // Mirrors closed_ for the progress thread's checks between writes.
  std::atomic<bool> stopping_{false};

  std::mutex faults_mu_;
  // Guarded by faults_mu_:
  int fail_writes_ = 0;
  absl::Duration completion_delay_ = absl::ZeroDuration();
  LoopbackTransport* kill_peer_ = nullptr;
  uint64_t kill_after_writes_ = 0;

  std::mutex join_mu_;  // serialises joining the progress thread
  std::thread progress_;
  std::thread::id progress_id_;  // set before the thread runs anything
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_LOOPBACK_LOOPBACK_TRANSPORT_H_
