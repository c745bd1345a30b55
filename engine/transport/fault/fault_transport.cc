#include "engine/transport/fault/fault_transport.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"
#include "engine/sync/thread_name.h"
#include "engine/transport/bounds.h"

namespace kvrail::transport {
namespace {

// The wrapper whose completion this thread is running, if any: Close called from one of them
// must not join the thread that may be running it.
thread_local const FaultTransport* delivering = nullptr;

Capabilities Named(const Capabilities& inner) {
  Capabilities named = inner;
  named.name = absl::StrCat("fault(", inner.name, ")");
  return named;
}

const char* Kind(bool flush) { return flush ? "flush" : "batch"; }

}  // namespace

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner)
    : inner_(std::move(inner)), capabilities_(Named(inner_->capabilities())) {
  lanes_.resize(capabilities_.lanes);
  counters_.held.assign(capabilities_.lanes, 0);
  delivery_ = std::thread([this] { RunDelivery(); });
  NameThread(delivery_, "kvrail-faultdlv");
}

FaultTransport::~FaultTransport() { Close(); }

absl::StatusOr<RegionId> FaultTransport::Register(const LocalRegion& region) {
  KVRAIL_ASSIGN_OR_RETURN(RegionId id, inner_->Register(region));
  std::lock_guard<std::mutex> lock(mu_);
  regions_[id] = region.length;
  return id;
}

absl::StatusOr<SharedRegion> FaultTransport::Allocate(uint64_t length) {
  KVRAIL_ASSIGN_OR_RETURN(SharedRegion shared, inner_->Allocate(length));
  std::lock_guard<std::mutex> lock(mu_);
  regions_[shared.region] = shared.length;
  return shared;
}

absl::Status FaultTransport::Deregister(RegionId region) {
  // Held posts from the region are forwarded later, rejected there and cancelled (ResumeLane).
  KVRAIL_RETURN_IF_ERROR(inner_->Deregister(region));
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(region);
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> FaultTransport::LocalDescriptor() const {
  return inner_->LocalDescriptor();
}

absl::StatusOr<PeerId> FaultTransport::Connect(const v1::HandshakeDescriptor& peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Connect: the transport is closed");
    Injection taken;
    if (TakeInjectionLocked(Op::kConnect, &taken)) return taken.status;
  }
  KVRAIL_ASSIGN_OR_RETURN(PeerId id, inner_->Connect(peer));
  // The inner transport accepted the descriptor, so its regions are well formed; they are kept
  // to check held posts as the inner transport will.
  absl::StatusOr<RemoteRegions> regions = RemoteRegions::FromDescriptor(peer);
  if (!regions.ok()) {
    inner_->Disconnect(id).IgnoreError();
    return regions.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  peers_.insert_or_assign(id, *std::move(regions));
  return id;
}

absl::Status FaultTransport::CheckCallLocked(PeerId peer, int lane, const RegionId* source,
                                             absl::Span<const Write> writes) const {
  if (closed_) return absl::FailedPreconditionError("the transport is closed");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  auto remote = peers_.find(peer);
  if (remote == peers_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("peer %d is not connected (never connected, or disconnected)", peer));
  }
  if (source == nullptr) return absl::OkStatus();
  auto region = regions_.find(*source);
  if (region == regions_.end()) {
    return absl::NotFoundError(absl::StrFormat("source region %d is not registered", *source));
  }
  return CheckWrites(writes, region->second, remote->second, capabilities_);
}

bool FaultTransport::TakeInjectionLocked(Op op, Injection* taken) {
  Injection& slot = op == Op::kPostWrites ? post_failures_
                    : op == Op::kFlush    ? flush_failures_
                                          : connect_failures_;
  if (slot.count <= 0) return false;
  --slot.count;
  ++counters_.injected;
  *taken = slot;
  return true;
}

absl::Status FaultTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                        absl::Span<const Write> writes, Completion done) {
  const auto context = [&] {
    return absl::StrFormat("PostWrites to peer %d lane %d from region %d", peer, lane, source);
  };
  if (!done) return absl::InvalidArgumentError(context() + ": the completion is empty");
  Held call{.flush = false, .peer = peer, .lane = lane, .source = source, .done = std::move(done)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVRAIL_RETURN_IF_ERROR(AddContext(CheckCallLocked(peer, lane, &source, writes), context()));
    Injection taken;
    if (TakeInjectionLocked(Op::kPostWrites, &taken)) {
      if (taken.mode == FailMode::kReturned) return taken.status;
      // Nothing is forwarded, so nothing lands; the path's next Flush must not say it did.
      Path& path = paths_[{peer, lane}];
      if (path.first_failure.ok()) path.first_failure = taken.status;
      QueueLocked(peer, lane, std::move(call.done), taken.status, lanes_[lane].delay);
      return absl::OkStatus();
    }
    LaneFaults& faults = lanes_[lane];
    if (faults.stopped || faults.draining) {
      call.writes.assign(writes.begin(), writes.end());
      faults.held.push_back(std::move(call));
      ++counters_.held[lane];
      return absl::OkStatus();
    }
  }
  return Forward(call, writes);
}

absl::Status FaultTransport::Flush(PeerId peer, int lane, Completion done) {
  const auto context = [&] { return absl::StrFormat("Flush of peer %d lane %d", peer, lane); };
  if (!done) return absl::InvalidArgumentError(context() + ": the completion is empty");
  Held call{.flush = true, .peer = peer, .lane = lane, .done = std::move(done)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    KVRAIL_RETURN_IF_ERROR(AddContext(CheckCallLocked(peer, lane, nullptr, {}), context()));
    Injection taken;
    if (TakeInjectionLocked(Op::kFlush, &taken)) {
      if (taken.mode == FailMode::kReturned) return taken.status;
      call.injected = taken.status;
    }
    // The flush answers for every post of its path made before it.
    if (auto path = paths_.find({peer, lane}); path != paths_.end()) {
      call.earlier_failure = std::exchange(path->second.first_failure, absl::OkStatus());
    }
    LaneFaults& faults = lanes_[lane];
    if (faults.stopped || faults.draining) {
      faults.held.push_back(std::move(call));
      ++counters_.held[lane];
      return absl::OkStatus();
    }
  }
  absl::Status status = Forward(call, {});
  if (!status.ok() && !call.earlier_failure.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    Path& path = paths_[{peer, lane}];
    if (path.first_failure.ok()) path.first_failure = call.earlier_failure;
  }
  return status;
}

absl::Status FaultTransport::Forward(Held& call, absl::Span<const Write> writes) {
  // Shared with the inner completion so that a call the inner transport rejects keeps it.
  auto done = std::make_shared<Completion>(std::move(call.done));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.forwarded;  // before the call: its completion may run before it returns
  }
  absl::Status status;
  if (call.flush) {
    status = inner_->Flush(
        call.peer, call.lane,
        [this, done, peer = call.peer, lane = call.lane, earlier = call.earlier_failure,
         injected = call.injected](absl::Status flushed) {
          if (!injected.ok()) {
            flushed = injected;
          } else if (flushed.ok()) {
            flushed = earlier;
          }
          OnInnerDone(peer, lane, *done, std::move(flushed));
        });
  } else {
    status = inner_->PostWrites(call.peer, call.lane, call.source, writes,
                                [this, done, peer = call.peer, lane = call.lane](absl::Status s) {
                                  OnInnerDone(peer, lane, *done, std::move(s));
                                });
  }
  if (!status.ok()) {
    call.done = std::move(*done);
    std::lock_guard<std::mutex> lock(mu_);
    --counters_.forwarded;
  }
  return status;
}

void FaultTransport::OnInnerDone(PeerId peer, int lane, Completion& done, absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      // A disconnected peer's completions are not held back (Disconnect cuts delays short).
      const absl::Duration delay =
          closed_ || !peers_.contains(peer) ? absl::ZeroDuration() : lanes_[lane].delay;
      auto path = paths_.find({peer, lane});
      const bool behind = path != paths_.end() && path->second.queued > 0;
      if (delay > absl::ZeroDuration() || behind) {
        QueueLocked(peer, lane, std::move(done), std::move(status), delay);
        return;
      }
    }
  }
  // From the inner transport's progress context, as without the wrapper.
  Deliver(done, std::move(status));
}

void FaultTransport::QueueLocked(PeerId peer, int lane, Completion done, absl::Status status,
                                 absl::Duration delay) {
  Path& path = paths_[{peer, lane}];
  // Clamped so that now + delay cannot overflow the clock.
  const absl::Time due =
      std::max(absl::Now() + std::min(delay, absl::Hours(24 * 365)), path.last_due);
  path.last_due = due;
  ++path.queued;
  pending_.emplace(
      PendingKey{due, next_sequence_++},
      Pending{.peer = peer, .lane = lane, .done = std::move(done), .status = std::move(status)});
  changed_.notify_all();
}

void FaultTransport::CutShortLocked(const PeerId* peer, const char* why) {
  std::vector<PendingKey> keys;
  for (const auto& [key, pending] : pending_) {
    if (peer == nullptr || pending.peer == *peer) keys.push_back(key);
  }
  for (const PendingKey& key : keys) {
    auto node = pending_.extract(key);
    Pending& pending = node.mapped();
    if (pending.status.ok()) {
      pending.status = absl::CancelledError(
          absl::StrFormat("peer %d lane %d: %s before its delayed completion was delivered",
                          pending.peer, pending.lane, why));
    }
    paths_[{pending.peer, pending.lane}].last_due = absl::InfinitePast();
    node.key() = PendingKey{absl::InfinitePast(), key.second};  // due now, in the same order
    pending_.insert(std::move(node));
  }
  changed_.notify_all();
}

void FaultTransport::DropHeldLocked(const PeerId* peer, const char* why) {
  for (int lane = 0; lane < capabilities_.lanes; ++lane) {
    std::deque<Held>& held = lanes_[lane].held;
    std::deque<Held> kept;
    for (Held& call : held) {
      if (peer != nullptr && call.peer != *peer) {
        kept.push_back(std::move(call));
        continue;
      }
      ++counters_.dropped;
      --counters_.held[lane];
      QueueLocked(call.peer, lane, std::move(call.done),
                  absl::CancelledError(absl::StrFormat(
                      "%s to peer %d lane %d: %s while the lane was stopped; it was never sent",
                      Kind(call.flush), call.peer, lane, why)),
                  absl::ZeroDuration());
    }
    held.swap(kept);
  }
}

absl::Status FaultTransport::Disconnect(PeerId peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Disconnect: the transport is closed");
    if (peers_.erase(peer) == 0) {
      return absl::NotFoundError(absl::StrFormat(
          "Disconnect: peer %d is not connected (never connected, or disconnected)", peer));
    }
    CutShortLocked(&peer, "the peer was disconnected");
    DropHeldLocked(&peer, "the peer was disconnected");
    for (int lane = 0; lane < capabilities_.lanes; ++lane) {
      auto path = paths_.find({peer, lane});
      if (path != paths_.end() && path->second.queued == 0) paths_.erase(path);
    }
  }
  // A held call that a ResumeLane has taken and not yet forwarded is either accepted by the
  // inner transport before this and cancelled by it, or rejected after it and cancelled here.
  return inner_->Disconnect(peer);
}

void FaultTransport::Close() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!closed_) {
      closed_ = true;
      CutShortLocked(nullptr, "the transport was closed");
      DropHeldLocked(nullptr, "the transport was closed");
      peers_.clear();
      regions_.clear();
    }
    // A held call that a ResumeLane is forwarding is handed on (to the inner transport, or as
    // cancelled to the delivery thread) before the inner transport closes.
    changed_.wait(lock, [this] { return forwarding_ == 0; });
  }
  inner_->Close();  // the inner's completions come back through OnInnerDone
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    changed_.notify_all();
  }
  // From a completion, the delivery thread may be the caller; it ends once it has delivered
  // the rest, and the destructor (which calls Close again) joins it.
  if (InCompletion()) return;
  std::lock_guard<std::mutex> join(join_mu_);
  if (delivery_.joinable()) delivery_.join();
}

absl::Status FaultTransport::StopLane(int lane) {
  KVRAIL_RETURN_IF_ERROR(AddContext(CheckLane(lane, capabilities_.lanes), "StopLane"));
  std::lock_guard<std::mutex> lock(mu_);
  lanes_[lane].stopped = true;
  return absl::OkStatus();
}

absl::Status FaultTransport::ResumeLane(int lane) {
  KVRAIL_RETURN_IF_ERROR(AddContext(CheckLane(lane, capabilities_.lanes), "ResumeLane"));
  std::unique_lock<std::mutex> lock(mu_);
  LaneFaults& faults = lanes_[lane];
  faults.stopped = false;
  if (faults.draining) return absl::OkStatus();
  faults.draining = true;  // later calls queue behind the held ones until they are all forwarded
  while (!faults.stopped && !faults.held.empty()) {
    Held call = std::move(faults.held.front());
    faults.held.pop_front();
    --counters_.held[lane];
    ++forwarding_;
    lock.unlock();
    absl::Status status = Forward(call, call.writes);
    lock.lock();
    if (!status.ok()) {
      // Its caller was told OK: the call completes, cancelled (its source region or its peer
      // went while it was held, or the transport closed).
      if (call.flush && !call.earlier_failure.ok()) {
        Path& path = paths_[{call.peer, lane}];
        if (path.first_failure.ok()) path.first_failure = call.earlier_failure;
      }
      QueueLocked(call.peer, lane, std::move(call.done),
                  absl::CancelledError(absl::StrFormat(
                      "%s to peer %d lane %d: held while the lane was stopped, then refused: %s",
                      Kind(call.flush), call.peer, lane, status.ToString())),
                  absl::ZeroDuration());
    }
    --forwarding_;
    changed_.notify_all();
  }
  faults.draining = false;
  return absl::OkStatus();
}

absl::Status FaultTransport::DelayCompletions(int lane, absl::Duration delay) {
  KVRAIL_RETURN_IF_ERROR(AddContext(CheckLane(lane, capabilities_.lanes), "DelayCompletions"));
  std::lock_guard<std::mutex> lock(mu_);
  lanes_[lane].delay = std::max(delay, absl::ZeroDuration());
  return absl::OkStatus();
}

absl::Status FaultTransport::FailNext(Op op, int count, absl::Status status, FailMode mode) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FailNext: count is %d; it must be >= 0", count));
  }
  if (status.ok()) return absl::InvalidArgumentError("FailNext: the status to inject is OK");
  if (op == Op::kConnect && mode == FailMode::kCompleted) {
    return absl::InvalidArgumentError("FailNext: Connect has no completion; use kReturned");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Injection& slot = op == Op::kPostWrites ? post_failures_
                    : op == Op::kFlush    ? flush_failures_
                                          : connect_failures_;
  slot = Injection{.count = count, .status = std::move(status), .mode = mode};
  return absl::OkStatus();
}

FaultCounters FaultTransport::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void FaultTransport::Deliver(Completion& done, absl::Status status) {
  const FaultTransport* outer = std::exchange(delivering, this);
  done(std::move(status));
  delivering = outer;
}

bool FaultTransport::InCompletion() const { return delivering == this; }

void FaultTransport::RunDelivery() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (pending_.empty()) {
      if (stop_) return;
      changed_.wait(lock);
      continue;
    }
    auto first = pending_.begin();
    const absl::Time due = first->first.first;
    if (!stop_ && due > absl::Now()) {
      changed_.wait_for(lock, absl::ToChronoNanoseconds(due - absl::Now()));
      continue;
    }
    Pending next = std::move(first->second);
    pending_.erase(first);
    lock.unlock();
    Deliver(next.done, std::move(next.status));
    next.done = nullptr;  // the callable goes without the lock held
    lock.lock();
    // Counted until now, so that the path's next completion from the inner transport waits.
    auto path = paths_.find({next.peer, next.lane});
    if (path != paths_.end() && --path->second.queued == 0 && !peers_.contains(next.peer)) {
      paths_.erase(path);
    }
  }
}

}  // namespace kvrail::transport
