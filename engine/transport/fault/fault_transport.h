// A Transport that wraps another (the real backends: loopback, UCX) and injects the faults that
// the kernel cannot make here: a lane that stops and later goes on, completions that come late,
// and calls that fail (in the spirit of Mooncake TENT's FaultProxyTransport). With no fault
// set it forwards every call unchanged and runs the whole conformance suite
// (engine/transport/transport_conformance.h).
//
// The wrapper keeps the Transport contract itself (engine/transport/transport.h): every
// completion is called exactly once and never inline from the posting call; what the wrapper
// completes itself (late completions, failed posts, cancelled held calls) comes from its own
// delivery thread; no lock of the wrapper is held while it calls a completion or the inner
// transport. Completions of forwarded calls without a delay come from the inner transport's
// progress context, as they would without the wrapper.
//
// Fencing, for each fault (transport.h, "Fencing"):
//   * Held calls (StopLane) have not reached the inner transport. Disconnect and Close drop them
//     and complete them with kCancelled from the delivery thread: they never land. Resumed, they
//     are forwarded in order and follow the inner backend's contract, so a held Flush reports
//     only after the held writes before it landed (or failed).
//   * A PostWrites failed in its completion (FailMode::kCompleted) forwarded nothing: its writes
//     never land, and the next Flush of its (peer, lane) reports the failure.
//   * A Flush failed in its completion is still forwarded; it reports the injected status once
//     the inner flush completed, so it fences as a real failed flush does.
//   * Forwarded calls fence as the inner backend does.
#ifndef KVRAIL_ENGINE_TRANSPORT_FAULT_FAULT_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_FAULT_FAULT_TRANSPORT_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

// What the wrapper has done so far, for tests.
struct FaultCounters {
  std::vector<int> held;   // per lane: posts and flushes held now (StopLane)
  uint64_t forwarded = 0;  // posts and flushes the inner transport accepted
  uint64_t injected = 0;   // calls failed by FailNext
  uint64_t dropped = 0;    // held calls cancelled by Disconnect or Close
};

class FaultTransport final : public Transport {
 public:
  // The calls FailNext can fail.
  enum class Op { kPostWrites, kFlush, kConnect };

  // How an injected failure of a PostWrites or a Flush shows (a Connect always returns it).
  enum class FailMode {
    // The call returns the status: nothing is posted and its completion is never called.
    kReturned,
    // The call returns OK and its completion gets the status, never inline. A PostWrites
    // forwards nothing and the delivery thread completes it; a Flush is forwarded and reports
    // the status once the inner flush ended.
    kCompleted,
  };

  // Wraps `inner` (not null), which the wrapper owns and closes; starts the delivery thread.
  explicit FaultTransport(std::unique_ptr<Transport> inner);
  ~FaultTransport() override;
  FaultTransport(const FaultTransport&) = delete;
  FaultTransport& operator=(const FaultTransport&) = delete;

  // The inner transport's, named "fault(<inner name>)".
  const Capabilities& capabilities() const override { return capabilities_; }
  TransportCounters transport_counters() const override { return inner_->transport_counters(); }
  // Forwarded: what the inner transport would land of that writer, it refuses.
  absl::StatusOr<size_t> RefuseWriter(std::string_view writer) override {
    return inner_->RefuseWriter(writer);
  }
  absl::StatusOr<RegionId> Register(const LocalRegion& region) override;
  absl::StatusOr<SharedRegion> Allocate(uint64_t length) override;
  absl::Status Deregister(RegionId region) override;
  absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const override;
  absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& peer) override;
  // A call on a stopped lane is checked as the inner transport would check it (same errors),
  // then held. Held calls whose source region went before they were forwarded complete with
  // kCancelled.
  absl::Status PostWrites(PeerId peer, int lane, RegionId source, absl::Span<const Write> writes,
                          Completion done) override;
  absl::Status Flush(PeerId peer, int lane, Completion done) override;
  // Held calls of `peer` complete with kCancelled from the delivery thread (possibly after
  // Disconnect returns), and its delayed completions are delivered at once, an OK one as
  // kCancelled; then the inner transport disconnects it.
  absl::Status Disconnect(PeerId peer) override;
  // As Disconnect for every peer; then the inner transport closes. When it returns every
  // completion has been called, unless it was called from one.
  void Close() override;

  // Fault controls. Thread-safe; InvalidArgument for a lane outside [0, lanes).

  // Holds every later PostWrites and Flush on `lane`, of any peer: they return OK and wait, in
  // one FIFO per lane, without reaching the inner transport.
  absl::Status StopLane(int lane);

  // Forwards the lane's held calls to the inner transport in the order they were made, on the
  // calling thread, and returns once none is left (calls made meanwhile queue behind them, so
  // nothing overtakes a held call), unless the lane is stopped again or another ResumeLane is
  // already forwarding them. A held call the inner transport rejects completes with kCancelled.
  absl::Status ResumeLane(int lane);

  // Delivers every completion of `lane` that arrives from now on `delay` later, from the
  // delivery thread (zero: as the inner transport delivers it). Completions of one
  // (peer, lane) keep their order. Disconnect and Close cut the wait short (an OK completion
  // then reports kCancelled). A negative delay is zero.
  absl::Status DelayCompletions(int lane, absl::Duration delay);

  // The next `count` calls of `op` (of PostWrites and Flush: that pass the contract's checks)
  // fail with `status`, shown as `mode` says. InvalidArgument for count < 0, an OK status, or
  // kConnect with kCompleted. A later FailNext of the same op replaces the earlier one.
  absl::Status FailNext(Op op, int count, absl::Status status, FailMode mode = FailMode::kReturned);

  FaultCounters counters() const;

 private:
  // A post or a flush on a stopped lane, as it will be forwarded.
  struct Held {
    bool flush = false;
    PeerId peer = 0;
    int lane = 0;
    RegionId source = 0;        // posts only
    std::vector<Write> writes;  // posts only
    Completion done;
    absl::Status earlier_failure;  // flushes: what the path's injected post failures left
    absl::Status injected;         // flushes: FailNext's status (kCompleted), else OK
  };
  // A completion the delivery thread calls.
  struct Pending {
    PeerId peer = 0;
    int lane = 0;
    Completion done;
    absl::Status status;
  };
  // Per (peer, lane).
  struct Path {
    // The first post failed in its completion since the path's last Flush (FailNext).
    absl::Status first_failure;
    absl::Time last_due = absl::InfinitePast();  // keeps the path's completions in order
    int queued = 0;  // pending completions of the path, counting one being delivered
  };
  struct Injection {
    int count = 0;
    absl::Status status;
    FailMode mode = FailMode::kReturned;
  };
  // One lane's fault state.
  struct LaneFaults {
    bool stopped = false;
    bool draining = false;  // a ResumeLane is forwarding the held calls
    std::deque<Held> held;
    absl::Duration delay = absl::ZeroDuration();
  };
  using PathKey = std::pair<PeerId, int>;  // (peer, lane)
  // Pending completions in delivery order: (due, sequence number).
  using PendingKey = std::pair<absl::Time, uint64_t>;

  // mu_ held: the contract's checks of a post or a flush (`writes` null for a flush).
  absl::Status CheckCallLocked(PeerId peer, int lane, const RegionId* source,
                               absl::Span<const Write> writes) const;
  // mu_ held: consumes one injected failure of `op`, if any.
  bool TakeInjectionLocked(Op op, Injection* taken);
  // mu_ held: queues `done(status)` for the delivery thread, `delay` from now and after every
  // earlier completion of (peer, lane). Delivers nothing itself.
  void QueueLocked(PeerId peer, int lane, Completion done, absl::Status status,
                   absl::Duration delay);
  // mu_ held: every pending completion matching `peer` (all when null) is due now, an OK one
  // cancelled with `why`.
  void CutShortLocked(const PeerId* peer, const char* why);
  // mu_ held: moves the held calls matching `peer` (all when null) to the delivery thread as
  // cancelled.
  void DropHeldLocked(const PeerId* peer, const char* why);

  // Passes `call` to the inner transport, no lock held, and returns the inner's status; when
  // that is an error, `call.done` is left to the caller.
  absl::Status Forward(Held& call, absl::Span<const Write> writes);
  // A forwarded call's completion from the inner transport.
  void OnInnerDone(PeerId peer, int lane, Completion& done, absl::Status status);
  // Calls `done(status)` as this wrapper's completion (Close knows it is inside one).
  void Deliver(Completion& done, absl::Status status);
  void RunDelivery();
  bool InCompletion() const;

  const std::unique_ptr<Transport> inner_;
  const Capabilities capabilities_;

  // std::mutex, which TSan sees (Debian's absl::Mutex is not annotated for it).
  mutable std::mutex mu_;
  std::condition_variable changed_;  // notify_all on every change a waiter may need
  // Guarded by mu_:
  bool closed_ = false;
  bool stop_ = false;   // the delivery thread drains what is pending and ends
  int forwarding_ = 0;  // held calls popped by a ResumeLane and not yet handed on
  absl::flat_hash_map<RegionId, uint64_t> regions_;  // id -> length
  absl::flat_hash_map<PeerId, RemoteRegions> peers_;
  std::vector<LaneFaults> lanes_;
  absl::flat_hash_map<PathKey, Path> paths_;
  std::map<PendingKey, Pending> pending_;
  uint64_t next_sequence_ = 0;
  Injection post_failures_, flush_failures_, connect_failures_;
  FaultCounters counters_;

  std::mutex join_mu_;  // one joiner of the delivery thread at a time
  std::thread delivery_;
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_FAULT_FAULT_TRANSPORT_H_
