#include "engine/transport/ucx/ucx_lane.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/base/sanitizers.h"
#include "engine/transport/ucx/am_protocol.h"
#include "engine/transport/ucx/ucx_am.h"
#include "engine/transport/ucx/ucx_context.h"
#include "engine/transport/ucx/ucx_endpoint.h"
#include "engine/transport/ucx/ucx_puts.h"

namespace kvrail::transport::ucx_internal {
namespace {

#if KVRAIL_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

// ucp_worker_progress, where UCX's emulated puts copy peers' bytes into our registered memory.
// Under ThreadSanitizer those copies are ignored: the reader (the application, after a Flush
// completed on the initiator) is ordered after them only through UCX's uninstrumented shared
// memory or socket acknowledgements, which TSan cannot see, so every landed byte would be a
// false race. Our own state touched in UCX callbacks is the lane's thread's own, and the regions it
// reads there are written only while every lane's worker mutex is held (the caller holds its own).
unsigned ProgressWorker(void* worker) {
#if KVRAIL_TSAN
  __tsan_ignore_thread_begin();
#endif
  const unsigned events = ucp_worker_progress(static_cast<ucp_worker_h>(worker));
#if KVRAIL_TSAN
  __tsan_ignore_thread_end();
#endif
  return events;
}

// Every request's completion (puts, flushes, active messages), on the op's lane's thread: a
// batch completes when its last request does, a flush with its request or the peer's answer.
void OnPutDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  --op->requests;
  if (op->delivered) {
    if (op->requests == 0) op->home->Recycle(op);
    return;
  }
  switch (op->kind) {
    case OpKind::kFlush:
      // The context is formatted only for a failure: a flush per transfer is the common path.
      op->home->FinishFlush(op, status == UCS_OK
                                    ? absl::OkStatus()
                                    : FromUcs(status, absl::StrFormat("flush to peer %d lane %d",
                                                                      op->peer->id, op->lane)));
      return;
    case OpKind::kAmFlush:
      // Its message left; the peer's answer completes it (OnFlushReplyAm), or the endpoint's
      // failure does (OnEndpointError).
      if (status != UCS_OK) {
        op->home->FinishFlush(
            op, absl::UnavailableError(absl::StrFormat("flush to peer %d lane %d: UCX: %s",
                                                       op->peer->id, op->lane, Ucs(status))));
      }
      return;
    case OpKind::kBatch:
      break;
    case OpKind::kConnect:
    case OpKind::kClose:
      return;  // jobs only: never a request's user data
  }
  if (status != UCS_OK && op->status.ok()) {
    // Unavailable even when UCX says cancelled: it cancels when the endpoint failed, and the
    // transport's own cancellations (Disconnect, Close) deliver the op before UCX does.
    op->status = absl::UnavailableError(absl::StrFormat("batch to peer %d lane %d: write: UCX: %s",
                                                        op->peer->id, op->lane, Ucs(status)));
  }
  if (op->requests == 0) op->home->Finish(op, op->status);
}

}  // namespace

ucp_request_param_t RequestParam(Op* op) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = OnPutDone;
  param.user_data = op;
  return param;
}

absl::Status PostFailure(ucs_status_ptr_t request, const std::string& what) {
  return absl::UnavailableError(absl::StrFormat("%s: %s", what, Ucs(UCS_PTR_STATUS(request))));
}

std::string BatchContext(PeerId peer, int lane, RegionId source) {
  return absl::StrFormat("PostWrites to peer %d lane %d from region %d", peer, lane, source);
}
std::string FlushContext(PeerId peer, int lane) {
  return absl::StrFormat("Flush of peer %d lane %d", peer, lane);
}

absl::Status Cancellation(const Op& op, const char* why) {
  return absl::CancelledError(absl::StrFormat("%s to peer %d lane %d: %s before it completed",
                                              op.kind == OpKind::kBatch ? "batch" : "flush",
                                              op.peer->id, op.lane, why));
}

absl::Status OwnerGone(const Op& op) {
  const PeerProcess* owner = op.peer->owner.get();
  if (owner == nullptr) return absl::OkStatus();
  PeerLane& pl = op.peer->lanes[op.lane];
  const auto now = std::chrono::steady_clock::now();
  if (now - pl.owner_seen_alive < kOwnerSeenFor) return absl::OkStatus();
  if (!owner->Exited()) {
    pl.owner_seen_alive = now;
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrFormat(
      "flush to peer %d lane %d: the peer's process (pid %d) has exited: what was written went "
      "into memory it no longer owns, so nothing since the last flush counts as landed",
      op.peer->id, op.lane, owner->pid()));
}

Lane::~Lane() {
  if (wake_fd >= 0) close(wake_fd);
}

void Lane::WakeLocked() {
  if (!sleeping) return;
  const uint64_t one = 1;
  // A full counter (2^64 - 2 wakes unread) cannot happen: the thread reads it at each wake.
  (void)!write(wake_fd, &one, sizeof(one));
}

absl::Status AddLane(ucp_context_h context, int index, Shared* shared,
                     std::vector<std::unique_ptr<Lane>>& lanes) {
  auto lane = std::make_unique<Lane>();
  lane->index = index;
  lane->shared = shared;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Serialised: this thread sets it up, then only the lane's thread calls into it.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t s = ucp_worker_create(context, &wp, &lane->worker);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrFormat("ucx: ucp_worker_create for lane %d", index));
  }
  Lane& added = *lanes.emplace_back(std::move(lane));
  added.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (added.wake_fd < 0) {
    return absl::InternalError(
        absl::StrFormat("ucx: eventfd for lane %d: %s", index, std::strerror(errno)));
  }
  // Without an event fd (a transport that offers no events) the lane naps as it did before
  // UCX could wake it: jobs still wake it at once, peers' messages at the nap's end.
  if (ucp_worker_get_efd(added.worker, &added.worker_fd) != UCS_OK) added.worker_fd = -1;
  // Every lane serves both sides of the active-message path: a peer may write either way.
  if (absl::Status handlers = SetAmHandlers(added); !handlers.ok()) return handlers;
  ucp_address_t* address = nullptr;
  size_t length = 0;
  s = ucp_worker_get_address(added.worker, &address, &length);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrFormat("ucx: ucp_worker_get_address for lane %d", index));
  }
  added.address.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(added.worker, address);
  return absl::OkStatus();
}

Unsent WhyUnsent(const Lane& lane, const Op& op) {
  const PeerState& state = *op.peer;
  if (state.closed) return Unsent::kPeerClosed;
  if (state.lanes[lane.index].failed != UCS_OK) return Unsent::kEndpointFailed;
  if (op.kind == OpKind::kBatch && lane.shared->regions.Find(op.source) == nullptr) {
    return Unsent::kSourceWithdrawn;
  }
  return Unsent::kNo;
}

void Issue(Lane& lane, Op* op) {
  switch (op->kind) {
    case OpKind::kConnect:
      IssueConnect(lane, op);
      return;
    case OpKind::kClose:
      IssueClose(lane, op);
      return;
    case OpKind::kBatch:
    case OpKind::kFlush:
    case OpKind::kAmFlush:
      break;
  }
  PeerState& state = *op->peer;
  PeerLane& pl = state.lanes[lane.index];
  pl.ops.push_back(op);  // undelivered from here on
  const bool batch = op->kind == OpKind::kBatch;
  const Unsent unsent = WhyUnsent(lane, *op);
  // A peer closed while this waited in the queue: cancelled, never sent (its close job is
  // queued behind it).
  if (unsent == Unsent::kPeerClosed) {
    lane.Finish(op, Cancellation(*op, state.why));
    return;
  }
  if (unsent == Unsent::kEndpointFailed) {
    const std::string context =
        batch ? BatchContext(state.id, lane.index, op->source) : FlushContext(state.id, lane.index);
    absl::Status failed =
        FromUcs(pl.failed, absl::StrFormat("%s: the peer's endpoint failed", context));
    if (batch) {
      lane.Finish(op, std::move(failed));
    } else {
      lane.FinishFlush(op, std::move(failed));
    }
    return;
  }
  if (!batch) {
    if (lane.shared->am_writes) {
      SendAmFlush(lane, pl, op);
    } else {
      StartFlush(lane, pl.ep, op,
                 [&] { return FlushContext(state.id, lane.index) + ": ucp_ep_flush_nbx"; });
    }
    return;
  }
  // Deregister withdrew the source while the batch waited: its bytes are not touched.
  if (unsent == Unsent::kSourceWithdrawn) {
    lane.Finish(op, absl::CancelledError(absl::StrFormat(
                        "%s: the source region was deregistered before the batch was sent",
                        BatchContext(state.id, lane.index, op->source))));
    return;
  }
  Lane::Hold(op);
  if (lane.shared->am_writes) {
    IssueAmWrites(lane, pl, op);
  } else {
    IssuePuts(lane, pl, op);
  }
  if (lane.Release(op) && op->requests == 0) lane.Finish(op, op->status);
}

// At the lane's stop, on its thread: finishes the endpoints' closes, drains, destroys the worker.
void TearDown(Lane& lane) {
  // The close fences first (IssueClose): each peer's endpoint closes once the target answered
  // the last flush, or its endpoint failed, or kCloseFenceWait passed (a target that stopped).
  const auto fenced = std::chrono::steady_clock::now() + Lane::kCloseFenceWait;
  const auto unanswered = [&lane] {
    for (const auto& peer : lane.fencing) {
      const PeerLane& pl = peer->lanes[lane.index];
      if (!pl.fence_answered && pl.failed == UCS_OK) return true;
    }
    return false;
  };
  while (unanswered() && std::chrono::steady_clock::now() < fenced) ProgressWorker(lane.worker);
  for (auto& peer : lane.fencing) CloseEndpoint(lane, std::move(peer));
  lane.fencing.clear();
  // Endpoints closed by Close finish after a little progress; then let messages in flight
  // (wireup, acknowledgements of peers' puts) drain before the worker goes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!lane.closing.empty() && std::chrono::steady_clock::now() < deadline) {
    ProgressWorker(lane.worker);
    lane.ReapClosed();
  }
  // Closes that did not finish (a flushing close to a peer that stopped answering) are
  // released to UCX, which asserts at ucp_worker_destroy on a close request still held.
  for (auto& [request, peer] : lane.closing) {
    ucp_request_free(request);
    peer->DestroyRkeys(lane.index);
  }
  lane.closing.clear();
  for (int quiet = 0, rounds = 0; quiet < 16 && rounds < 100000; ++rounds) {
    quiet = ProgressWorker(lane.worker) == 0 ? quiet + 1 : 0;
  }
  ucp_worker_destroy(lane.worker);
  lane.worker = nullptr;
}

namespace {

// An idle lane's wait: arms the worker (UCS_ERR_BUSY: events came meanwhile, and the caller
// progresses again; false), then sleeps until the worker's event fd or the lane's wake fd is
// readable or `nap` ends (true).
bool SleepUntilWoken(Lane& lane, std::chrono::microseconds nap) {
  bool armed = false;
  if (lane.worker_fd >= 0) {
    std::lock_guard<std::mutex> working(lane.worker_mu);
    const ucs_status_t s = ucp_worker_arm(lane.worker);
    if (s == UCS_ERR_BUSY) return false;
    armed = s == UCS_OK;
    // A worker that cannot be armed: from now on the lane naps as one without an event fd.
    if (!armed) lane.worker_fd = -1;
  }
  {
    std::lock_guard<std::mutex> queue(lane.mu);
    if (!lane.jobs.empty() || lane.stop) return true;
    lane.sleeping = true;  // from here a push writes wake_fd
  }
  pollfd fds[2] = {{lane.wake_fd, POLLIN, 0}, {lane.worker_fd, POLLIN, 0}};
  const timespec timeout{0, static_cast<long>(nap.count()) * 1000};
  const int ready = ppoll(fds, armed ? 2 : 1, &timeout, nullptr);
  {
    std::lock_guard<std::mutex> queue(lane.mu);
    lane.sleeping = false;
  }
  const bool by_job = (fds[0].revents & POLLIN) != 0;
  if (by_job) {
    uint64_t wakes = 0;
    (void)!read(lane.wake_fd, &wakes, sizeof(wakes));
  }
  if (armed && (fds[1].revents & POLLIN) != 0) {
    lane.wakes_by_event.fetch_add(1, std::memory_order_relaxed);
  } else if (by_job) {
    lane.wakes_by_job.fetch_add(1, std::memory_order_relaxed);
  } else if (ready == 0) {
    lane.naps_ended.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

}  // namespace

void RunLane(Lane& lane) {
  // Named for top -H, perf and gdb: "ucx-lane0", "ucx-lane1", ...
  pthread_setname_np(pthread_self(), absl::StrFormat("ucx-lane%d", lane.index).c_str());
  int idle = 0;
  constexpr int kDeliveriesPerProgress = 8;
  int unpolled = 0;                       // delivery rounds since the last progress
  std::vector<Op*> jobs;                  // keeps its capacity from round to round, as does
  std::vector<DueCompletion> delivering;  // this one
  std::vector<Op*> waiting;  // batches that wait a round for another peer's (StoreSharedRows)
  while (true) {
    bool stop = false;
    unsigned events = 0;
    size_t issued = 0;
    {
      std::lock_guard<std::mutex> working(lane.worker_mu);
      {
        std::lock_guard<std::mutex> queue(lane.mu);
        lane.TakeJobsLocked(jobs);
        stop = lane.stop;
      }
      lane.tearing_down = stop;
      // Those that waited a round go first: they were queued before these.
      if (!waiting.empty()) {
        jobs.insert(jobs.begin(), waiting.begin(), waiting.end());
        waiting.clear();
      }
      // Rows that batches of several peers read slices of, each row read once for all of them;
      // then every job in the order they were queued: a lane's flush follows the batches it
      // covers.
      StoreSharedRows(lane, jobs, stop ? nullptr : &waiting);
      for (Op* job : jobs) Issue(lane, job);
      issued = jobs.size() + waiting.size();
      jobs.clear();
      if (stop) {
        TearDown(lane);
      } else {
        // Completions delivered last round may have posted puts that finished at once (over
        // shared memory a put is a copy, done before ucp_put_nbx returns): deliver those before
        // polling UCX again, polling at least every kDeliveriesPerProgress rounds so that
        // flushes, wireup and peers' messages still move. Polling once per post, perf put about
        // 8 % of a lane's time in ucp_worker_progress at 64 KiB writes over shm.
        if (lane.due.empty() || ++unpolled >= kDeliveriesPerProgress) {
          unpolled = 0;
          events = ProgressWorker(lane.worker);
        }
        if (!lane.closing.empty()) lane.ReapClosed();
      }
    }
    // No lock held: a completion may post, flush, register, disconnect or close.
    const bool delivered = !lane.due.empty();
    if (delivered) {
      delivering.swap(lane.due);
      for (DueCompletion& r : delivering) r.done(std::move(r.status));
      delivering.clear();  // destroys the callables
    }
    if (stop) return;
    if (events > 0 || issued > 0 || delivered) {
      idle = 0;
      continue;
    }
    // Back off when idle: spin a little, then sleep, woken at once by a new job or, through the
    // worker's event fd, by a peer's message or a socket that can take more bytes. The nap is
    // 1 ms, a bound for what UCX does not signal. Without the event fd, nothing but a job wakes
    // the lane early, so the nap grows from 10 µs to 1 ms as the lane stays idle. (Over tcp the
    // event fd took a warm room's first byte from 1.6-2.5 ms to 1.1-1.9 ms: BENCHMARKS.md, "An
    // idle lane wakes on UCX's events".)
    if (++idle < 16) {
      std::this_thread::yield();
      continue;
    }
    const auto nap =
        std::chrono::microseconds(lane.worker_fd >= 0 ? 1000 : std::min(1000, 10 * (idle - 15)));
    if (!SleepUntilWoken(lane, nap)) std::this_thread::yield();
  }
}

}  // namespace kvrail::transport::ucx_internal
