#include "engine/transport/ucx/ucx_transport.h"

#include <fcntl.h>
#include <pthread.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"
#include "engine/memory/prefault.h"
#include "engine/transport/bounds.h"
#include "engine/transport/landing_copy.h"
#include "engine/transport/region_table.h"
#include "engine/transport/shared_region.h"
#include "engine/transport/ucx/am_protocol.h"

namespace kvrail::transport {
namespace ucx_internal {

struct RegionState {
  ucp_mem_h memh = nullptr;
  std::string rkey;    // ucp_rkey_pack bytes
  int shared_fd = -1;  // Allocate's "ucx-shm" placement: our dup of UCX's segment fd
  // Unmaps (and for an allocated region frees) the memory. Runs under the transport's mutex.
  void Release(ucp_context_h context) {
    ucp_mem_unmap(context, memh);
    memh = nullptr;
    if (shared_fd >= 0) close(shared_fd);
    shared_fd = -1;
  }
};

struct PeerState;
struct Lane;

enum class OpKind {
  kBatch,    // PostWrites
  kFlush,    // Flush over puts (and Connect's wireup): ucp_ep_flush_nbx
  kAmFlush,  // Flush over active messages: done when the peer's am::FlushReply arrives
  // Jobs that only the lane's queue carries, never delivered:
  kConnect,  // Connect: the peer's endpoint on this lane; then the op is the wireup's kFlush
  kClose,    // Disconnect, Close, a failed Connect: cancel the peer's ops here, close its endpoint
};

// One job of a lane's queue, and then (batches and flushes) one operation in UCX. Filled by the
// posting thread under the lane's queue mutex; the lane's thread's alone once it is taken off
// the queue. Freed, or recycled, once it is delivered and no UCX request still points at it.
struct Op {
  PeerState* peer = nullptr;  // kept alive by the peer's close jobs until its endpoints close
  int lane = 0;
  OpKind kind = OpKind::kBatch;
  int requests = 0;  // UCX requests outstanding with this op as user data
  bool delivered = false;
  absl::Status status;  // the first failure of a batch's puts
  Completion done;
  Lane* home = nullptr;  // the lane whose ready list gets the completion
  uint64_t seq = 0;      // kAmFlush: the number the peer's answer names
  // Active-message headers: UCX reads each until its send completes. Reserved before the first
  // send (so none moves) and kept with its capacity when the op is recycled.
  std::vector<am::AmHeader> headers;
  // kWritesAm messages: their entries and the gather list UCX reads each payload from (entries
  // first, then the writes' source bytes), kept like `headers` until the sends complete.
  std::vector<am::PackedWrite> packed;
  // The batch cut into active messages (am_protocol.h, PlanMessages).
  std::vector<am::AmMessage> plan;
  std::vector<ucp_dt_iov_t> gather;
  // A batch as PostWrites checked it: the source region (sent only while it is registered),
  // its bytes, the writes and each one's index in the peer's descriptor regions (its rkey).
  // The vectors keep their capacity when the op is recycled.
  RegionId source = 0;
  const std::byte* base = nullptr;
  std::vector<Write> writes;
  std::vector<int> region_of;
  // kClose: the peer, alive until its endpoint on this lane has closed.
  std::shared_ptr<PeerState> closing;
};

// What one lane keeps of one peer. Only that lane's thread touches it once the peer's connect
// job has been queued (the fields filled before are fixed). One cache line apart from the
// peer's other lanes, which other threads write at once.
struct alignas(64) PeerLane {
  PeerState* peer = nullptr;  // with `lane`, the endpoint's error handler's argument
  int lane = 0;
  am::AmWriter writer;  // the active-message path: this connection's token, messages, flushes
  ucp_ep_h ep = nullptr;
  bool peer_mode = false;         // the endpoint has peer-failure handling
  std::vector<ucp_rkey_h> rkeys;  // [descriptor region index]
  absl::Status error;             // first failure of a batch since the lane's last Flush
  ucs_status_t failed = UCS_OK;   // set by UCX's error handler
  std::deque<Op*> ops;            // undelivered batches and flushes, oldest first
};

// A connected (or connecting) peer. Everything but `closed` and `why` is fixed before its
// first job is queued, or is its lanes' (see PeerLane).
struct PeerState {
  PeerId id = 0;
  std::string name;  // for messages: "session <id>" (from the descriptor)
  RemoteRegions regions;
  // What the connect jobs need of the descriptor: the peer's worker address for each local
  // lane, and its regions' packed rkeys.
  std::vector<std::string> remote_addresses;
  std::vector<std::string> remote_keys;
  std::vector<uint64_t> remote_bases;  // [descriptor region index]
  std::vector<uint64_t> remote_lengths;
  // [descriptor region index]: whether UCX maps that region into this process (ucp_rkey_ptr:
  // the peer's own shared-memory segment, from its Allocate), and if so the offset from a
  // remote address in it to the local one. One mapping for every lane: lane 0's, learnt by its
  // connect job before Connect returns (so fixed before any post), so that the lanes share one
  // set of page-table entries: a page that lane 0 wrote in one room and lane 1 writes in the
  // next faults once, not once per lane. Lane 0's rkeys, which hold the mapping, go only after
  // ClosePeer, when no lane stores for the peer any more.
  std::vector<char> mapped;
  std::vector<intptr_t> mapped_delta;
  // For each mapped region: its page-table entries made a chunk at a time ahead of the first
  // stores there (engine/memory/prefault.h), by whichever lane stores first.
  std::vector<std::unique_ptr<Prefaulter>> prefault;
  std::shared_ptr<ConnectWait> connect_wait;
  // ClosePeer ran: written holding every lane's worker mutex, so a lane's thread reads them
  // holding its own. Its jobs still queued are cancelled, not sent.
  bool closed = false;
  const char* why = "";  // why it was closed, for the cancellations
  std::vector<PeerLane> lanes;
  PeerState(RemoteRegions r, int lane_count, size_t region_count) : regions(std::move(r)) {
    lanes.resize(lane_count);
    std::random_device random;
    for (int lane = 0; lane < lane_count; ++lane) {
      PeerLane& pl = lanes[lane];
      pl.peer = this;
      pl.lane = lane;
      pl.writer = am::AmWriter((uint64_t{random()} << 32) ^ random() ^ (uint64_t(lane) << 56));
      pl.rkeys.assign(region_count, nullptr);
    }
  }
  // On the lane's thread, once the lane's endpoint is closed (UCX wants an endpoint's rkeys
  // gone before its worker, and puts still draining at close may use them).
  void DestroyRkeys(int lane) {
    for (ucp_rkey_h& rkey : lanes[lane].rkeys) {
      if (rkey != nullptr) ucp_rkey_destroy(rkey);
      rkey = nullptr;
    }
  }
};

struct Ready {
  Completion done;
  absl::Status status;
};

// Connect's wait for the wireup of every lane: told by the lanes' threads.
struct ConnectWait {
  std::mutex mu;
  std::condition_variable changed;
  int pending = 0;       // lanes whose wireup has not completed
  absl::Status failure;  // the first lane's failure
  void Done(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    --pending;
    if (!status.ok() && failure.ok()) failure = std::move(status);
    changed.notify_all();
  }
};

// One lane: a worker, the thread that alone calls into it, and the queue that feeds that thread.
struct Lane {
  int index = 0;
  UcxTransport* transport = nullptr;
  ucp_worker_h worker = nullptr;  // made by Init; destroyed by the thread (or ReleaseAll)
  std::string address;            // ucp_worker_get_address bytes
  std::thread thread;

  // Held by the lane's thread while it calls into the worker (its jobs, then a progress), never
  // while it delivers completions or sleeps; posts, flushes and Connect never take it. The calls
  // that change what the thread reads there (the regions, a peer's `closed`) take every lane's,
  // so that when they return no lane still copies into a withdrawn region or sends for a closed
  // peer. Taken before `mu`.
  std::mutex worker_mu;

  // The queue's mutex: held to push or take jobs, never across a UCX call or a wait.
  std::mutex mu;
  std::condition_variable changed;
  // Guarded by mu:
  std::vector<Op*> jobs;  // oldest first; the thread takes them all at once
  bool stop = false;      // Close: tear down and exit
  // Ops for the next posts (a post over shared memory is a copy of a few microseconds, and a
  // malloc and a free per post showed in perf); at most kSpareOps.
  static constexpr size_t kSpareOps = 256;
  std::vector<std::unique_ptr<Op>> spare;

  // The thread's own:
  std::vector<Ready> ready;  // swapped with the delivery round's, so delivery never allocates
  std::vector<std::unique_ptr<Op>> recycled;  // finished ops, handed to `spare` at the next take
  // Endpoint-close requests, each with the peer whose rkeys on this lane go when it finishes.
  std::vector<std::pair<void*, std::shared_ptr<PeerState>>> closing;
  // The active-message path: this lane's peers by token (for their flushes' answers), and what
  // it keeps for each writer that writes into it.
  std::unordered_map<uint64_t, PeerState*> outbound;
  am::AmTarget target;

  // mu held. An op for a post, from the spare ones when there is one.
  Op* TakeOpLocked() {
    if (spare.empty()) return new Op;
    Op* op = spare.back().release();
    spare.pop_back();
    return op;
  }

  // mu held. Queues `op` as a job of `kind` for `peer` on this lane and wakes the thread.
  void PushLocked(Op* op, PeerState& peer, OpKind kind, Completion done) {
    op->peer = &peer;
    op->lane = index;
    op->kind = kind;
    op->done = std::move(done);
    op->home = this;
    jobs.push_back(op);
    changed.notify_one();
  }

  // mu held, on the thread. Takes every queued job into `taken` (empty) and gives the ops that
  // finished since back to the spare ones.
  void TakeJobsLocked(std::vector<Op*>& taken) {
    taken.swap(jobs);
    for (auto& op : recycled) {
      if (spare.size() >= kSpareOps) break;
      spare.push_back(std::move(op));
    }
    recycled.clear();  // deletes what did not fit
  }

  // On the thread, from here on. Moves `op`'s completion onto the ready list once; recycles it
  // when UCX is done too.
  void Finish(Op* op, absl::Status status) {
    if (!op->delivered) {
      op->delivered = true;
      PeerLane& pl = op->peer->lanes[op->lane];
      auto& ops = pl.ops;
      if (ops.front() == op) {
        ops.pop_front();  // the usual case: a lane's operations finish in order
      } else {
        ops.erase(std::find(ops.begin(), ops.end(), op));
      }
      if (op->kind == OpKind::kBatch && !status.ok() && pl.error.ok()) pl.error = status;
      ready.push_back({std::move(op->done), std::move(status)});
    }
    if (op->requests == 0) Recycle(op);
  }

  // Around the UCX calls that post `op`: UCX may call back inside them (an endpoint that fails
  // while sending finishes the op), and the hold keeps the op alive until Release.
  static void Hold(Op* op) { ++op->requests; }
  // Ends the hold. Returns false when `op` has been delivered meanwhile (and maybe recycled:
  // the caller must not touch it again); true when it is still the caller's.
  bool Release(Op* op) {
    --op->requests;
    if (!op->delivered) return true;
    if (op->requests == 0) Recycle(op);
    return false;
  }

  // A flush's outcome: the first failure of the batches before it, else `status`.
  void FinishFlush(Op* op, absl::Status status) {
    absl::Status result = std::exchange(op->peer->lanes[op->lane].error, absl::OkStatus());
    Finish(op, result.ok() ? std::move(status) : std::move(result));
  }

  // Keeps a finished op (or a job done with) for a later post, with its vectors' capacity up to
  // a bound (at most kSpareOps ops wait, each keeping at most 1024 writes, about 24 KiB).
  void Recycle(Op* op) {
    std::vector<am::AmHeader> headers = std::move(op->headers);
    std::vector<am::PackedWrite> packed = std::move(op->packed);
    std::vector<am::AmMessage> plan = std::move(op->plan);
    std::vector<ucp_dt_iov_t> gather = std::move(op->gather);
    std::vector<Write> writes = std::move(op->writes);
    std::vector<int> region_of = std::move(op->region_of);
    headers.clear();
    packed.clear();
    plan.clear();
    gather.clear();
    writes.clear();
    region_of.clear();
    *op = Op();
    if (headers.capacity() <= 4096) op->headers = std::move(headers);
    if (plan.capacity() <= 4096) op->plan = std::move(plan);
    if (packed.capacity() <= 4096 && gather.capacity() <= 8192) {
      op->packed = std::move(packed);
      op->gather = std::move(gather);
    }
    if (writes.capacity() <= 1024) {
      op->writes = std::move(writes);
      op->region_of = std::move(region_of);
    }
    recycled.emplace_back(op);
  }

  // Frees the close requests that finished, and their peers' rkeys on this lane.
  void ReapClosed() {
    closing.erase(std::remove_if(closing.begin(), closing.end(),
                                 [this](std::pair<void*, std::shared_ptr<PeerState>>& entry) {
                                   if (ucp_request_check_status(entry.first) == UCS_INPROGRESS) {
                                     return false;
                                   }
                                   ucp_request_free(entry.first);
                                   entry.second->DestroyRkeys(index);
                                   return true;
                                 }),
                  closing.end());
  }
};

namespace {

std::string Ucs(ucs_status_t status) { return ucs_status_string(status); }

absl::Status FromUcs(ucs_status_t status, const std::string& context) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrFormat("%s: UCX: %s", context, Ucs(status));
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(message);
  return absl::UnavailableError(message);
}

}  // namespace
// Every lane's worker mutex, then every lane's queue mutex, each in lane order, released in
// reverse: with the transport's mu_, what a writer of the transport-wide state holds. A post
// reads that state holding only its lane's queue mutex, a lane's thread holding only its
// worker mutex.
class AllLanes {
 public:
  explicit AllLanes(const std::vector<std::unique_ptr<Lane>>& lanes) : lanes_(lanes) {
    for (const auto& lane : lanes_) lane->worker_mu.lock();
    for (const auto& lane : lanes_) lane->mu.lock();
  }
  ~AllLanes() {
    for (auto it = lanes_.rbegin(); it != lanes_.rend(); ++it) (*it)->mu.unlock();
    for (auto it = lanes_.rbegin(); it != lanes_.rend(); ++it) (*it)->worker_mu.unlock();
  }
  AllLanes(const AllLanes&) = delete;
  AllLanes& operator=(const AllLanes&) = delete;

 private:
  const std::vector<std::unique_ptr<Lane>>& lanes_;
};

}  // namespace ucx_internal

using ucx_internal::AllLanes;
using ucx_internal::ConnectWait;
using ucx_internal::FromUcs;
using ucx_internal::Lane;
using ucx_internal::Op;
using ucx_internal::OpKind;
using ucx_internal::PeerLane;
using ucx_internal::PeerState;
using ucx_internal::Ready;
using ucx_internal::RegionState;
using ucx_internal::Ucs;

namespace {

#if defined(__SANITIZE_THREAD__)
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
#if defined(__SANITIZE_THREAD__)
  __tsan_ignore_thread_begin();
#endif
  const unsigned events = ucp_worker_progress(static_cast<ucp_worker_h>(worker));
#if defined(__SANITIZE_THREAD__)
  __tsan_ignore_thread_end();
#endif
  return events;
}

// Error handler for every endpoint: arg is its PeerLane. Runs in UCX calls on that lane's
// worker, on the lane's thread. UCX fails the endpoint's requests itself; flushes waiting for
// the peer's answer (the active-message path) would wait for ever, so they fail here.
void OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  PeerLane& pl = *static_cast<PeerLane*>(arg);
  if (pl.failed == UCS_OK) pl.failed = status;
  std::vector<Op*> waiting;
  for (Op* op : pl.ops) {
    if (op->kind == OpKind::kAmFlush) waiting.push_back(op);
  }
  for (Op* op : waiting) {
    op->home->FinishFlush(
        op, FromUcs(status, absl::StrFormat("flush to peer %d lane %d: the peer's endpoint failed",
                                            pl.peer->id, pl.lane)));
  }
}

// Sends an active message whose header `owned` (allocated with new) UCX may read until the send
// completes, then frees it. The outcome is not reported: the target's answers and a writer's
// goodbye are best effort (a peer that is gone needs neither).
template <typename Header>
void SendOwnedAm(ucp_ep_h ep, unsigned id, Header* owned) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<Header*>(user_data);
    ucp_request_free(request);
  };
  param.user_data = owned;
  ucs_status_ptr_t request = ucp_am_send_nbx(ep, id, owned, sizeof(Header), nullptr, 0, &param);
  if (!UCS_PTR_IS_PTR(request)) delete owned;  // done at once, or failed
}

// The writer's endpoint, from which a message's answer goes back; nullptr when the writer did
// not send one (not a kvrail writer).
ucp_ep_h ReplyEndpoint(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
}

// Answers a flush through the writer's reply endpoint; best effort (SendOwnedAm).
class ReplyThrough {
 public:
  explicit ReplyThrough(ucp_ep_h reply_ep) : reply_ep_(reply_ep) {}
  void operator()(const am::FlushReply& reply) const {
    SendOwnedAm(reply_ep_, am::kFlushReplyAm, new am::FlushReply(reply));
  }

 private:
  ucp_ep_h reply_ep_;
};

// The target's side of a flush (am::AmTarget::OnFlush).
ucs_status_t OnFlushAm(void* arg, const void* header, size_t header_length, void* /*data*/,
                       size_t /*length*/, const ucp_am_recv_param_t* param) {
  am::AmHeader flush;
  if (!am::ReadHeader(header, header_length, &flush)) return UCS_OK;
  ucp_ep_h reply_ep = ReplyEndpoint(param);
  if (reply_ep == nullptr) return UCS_OK;
  const ReplyThrough send(reply_ep);
  const am::Reply reply(send);
  static_cast<Lane*>(arg)->target.OnFlush(flush, &reply);
  return UCS_OK;
}

// The writer's side of a flush's answer: the flush completes, with the first failure of its
// lane's batches, else with the refusal the target reports, else OK.
ucs_status_t OnFlushReplyAm(void* arg, const void* header, size_t header_length, void* /*data*/,
                            size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  am::FlushReply reply;
  if (!am::ReadHeader(header, header_length, &reply)) return UCS_OK;
  Lane& lane = *static_cast<Lane*>(arg);
  auto found = lane.outbound.find(reply.token);
  if (found == lane.outbound.end()) return UCS_OK;  // disconnected since
  PeerState& peer = *found->second;
  for (Op* op : peer.lanes[lane.index].ops) {
    if (op->kind != OpKind::kAmFlush || op->seq != reply.seq) continue;
    lane.FinishFlush(op, am::FlushReplyStatus(reply, peer.id, lane.index));
    break;
  }
  return UCS_OK;
}

// A writer that disconnects says goodbye: the target forgets what it kept for it.
ucs_status_t OnByeAm(void* arg, const void* header, size_t header_length, void* /*data*/,
                     size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  am::AmHeader bye;
  if (!am::ReadHeader(header, header_length, &bye)) return UCS_OK;
  static_cast<Lane*>(arg)->target.OnBye(bye);
  return UCS_OK;
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
      op->home->FinishFlush(
          op, FromUcs(status, absl::StrFormat("flush to peer %d lane %d", op->peer->id, op->lane)));
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

// What a post and a flush give UCX with every request: OnPutDone, and the op.
ucp_request_param_t RequestParam(Op* op) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = OnPutDone;
  param.user_data = op;
  return param;
}

// A write's failure to start, as a batch reports it: Unavailable (UCX cancels only the requests
// of an endpoint that failed).
absl::Status PostFailure(ucs_status_ptr_t request, const std::string& what) {
  return absl::UnavailableError(absl::StrFormat("%s: %s", what, Ucs(UCS_PTR_STATUS(request))));
}

// A flush over puts (or Connect's wireup): ucp_ep_flush_nbx of `ep` completes `op`.
void StartFlush(Lane& lane, ucp_ep_h ep, Op* op, const std::string& what) {
  ucp_request_param_t param = RequestParam(op);
  Lane::Hold(op);
  ucs_status_ptr_t request = ucp_ep_flush_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) ++op->requests;
  if (!lane.Release(op)) return;
  if (request == nullptr) {
    lane.FinishFlush(op, absl::OkStatus());
  } else if (UCS_PTR_IS_ERR(request)) {
    lane.FinishFlush(op, PostFailure(request, what));
  }
}

// What a batch's and a flush's errors start with.
std::string BatchContext(PeerId peer, int lane, RegionId source) {
  return absl::StrFormat("PostWrites to peer %d lane %d from region %d", peer, lane, source);
}
std::string FlushContext(PeerId peer, int lane) {
  return absl::StrFormat("Flush of peer %d lane %d", peer, lane);
}

// A batch's or a flush's cancellation: Disconnect, Close, or a failed Connect (`why`).
absl::Status Cancellation(const Op& op, const char* why) {
  return absl::CancelledError(absl::StrFormat("%s to peer %d lane %d: %s before it completed",
                                              op.kind == OpKind::kBatch ? "batch" : "flush",
                                              op.peer->id, op.lane, why));
}

// Peer-failure handling over shared memory (off in UCX 1.13 by default): a peer whose process
// died then fails its endpoints through UCX's keepalive, where writes to it would otherwise stay
// pending for ever. UCX takes this one from the environment only: set through ucp_config_modify
// (MM_ERROR_HANDLING), endpoints accept UCP_ERR_HANDLING_MODE_PEER but two such processes never
// see each other die (measured: a writer's flush to a SIGKILLed target hung for a minute; with
// the variable in either process's environment it failed within the keepalive interval). So the
// first transport of a process sets UCX_MM_ERROR_HANDLING=y, unless the operator chose any of
// the variables that name it.
void EnableSharedMemoryPeerFailure() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"UCX_MM_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING",
                             "UCX_SYSV_ERROR_HANDLING", "UCX_SM_ERROR_HANDLING"}) {
      if (std::getenv(name) != nullptr) return;
    }
    setenv("UCX_MM_ERROR_HANDLING", "y", /*overwrite=*/0);
  });
}

// A peer's name for messages: its descriptor's session id.
std::string PeerName(const v1::HandshakeDescriptor& peer) {
  if (peer.session_id().empty()) {
    return absl::StrFormat("the peer of a descriptor (version %d) without a session id",
                           peer.version());
  }
  return absl::StrCat("session ", peer.session_id());
}

// Whether UCX may load a transport whose name `tls` lists (UCX's own default loads them all).
bool TlsMayUse(const std::string& tls, std::initializer_list<const char*> names) {
  if (tls.empty()) return true;
  for (const char* name : names) {
    if (tls.find(name) != std::string::npos) return true;
  }
  return false;
}

// A UCX memory-units setting such as "64K", "65536" or "8kb"; 0 when it is none of those.
uint64_t ParseUcxBytes(const char* text) {
  char* end = nullptr;
  const unsigned long long number = std::strtoull(text, &end, 10);
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return number;
  if (unit == "k" || unit == "kb") return number << 10;
  if (unit == "m" || unit == "mb") return number << 20;
  return 0;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> UcxTuningEnvironment(const UcxOptions& options) {
  std::vector<std::pair<std::string, std::string>> env;
  if (options.tcp_tx_seg_bytes != 0) {
    env.emplace_back("UCX_TCP_TX_SEG_SIZE", std::to_string(options.tcp_tx_seg_bytes));
  }
  if (options.tcp_rx_seg_bytes != 0) {
    env.emplace_back("UCX_TCP_RX_SEG_SIZE", std::to_string(options.tcp_rx_seg_bytes));
  }
  return env;
}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx options: lanes is %d; at least 1 is needed", options.lanes));
  }
  if (options.max_write_bytes == 0) {
    return absl::InvalidArgumentError("ucx options: max_write_bytes is 0; it must be > 0");
  }
  constexpr uint64_t kMinSeg = uint64_t{1} << 10, kMaxSeg = uint64_t{16} << 20;
  if (options.tcp_tx_seg_bytes != 0 &&
      (options.tcp_tx_seg_bytes < kMinSeg || options.tcp_tx_seg_bytes > kMaxSeg)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: tcp_tx_seg_bytes is %u; it must be 0 (UCX's default) or in [%u, %u]",
        options.tcp_tx_seg_bytes, kMinSeg, kMaxSeg));
  }
  if (options.tcp_rx_seg_bytes != 0 && options.tcp_rx_seg_bytes < options.tcp_tx_seg_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: tcp_rx_seg_bytes is %u, smaller than tcp_tx_seg_bytes %u; a peer's rx "
        "segment must hold this side's tx segment",
        options.tcp_rx_seg_bytes, options.tcp_tx_seg_bytes));
  }
  if (options.keepalive_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx options: keepalive_interval is ",
                                                   absl::FormatDuration(options.keepalive_interval),
                                                   "; it must be >= 0"));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx options: connect_timeout is ",
                                                   absl::FormatDuration(options.connect_timeout),
                                                   "; it must be > 0"));
  }
  std::unique_ptr<UcxTransport> transport(new UcxTransport(options));
  absl::Status status = transport->Init(options);
  if (!status.ok()) {
    transport->Close();
    return status;
  }
  for (auto& lane : transport->lanes_) {
    lane->thread = std::thread([t = transport.get(), l = lane.get()] { t->RunLane(*l); });
    transport->lane_threads_.push_back(lane->thread.get_id());
  }
  return transport;
}

UcxTransport::UcxTransport(const UcxOptions& options)
    : capabilities_{
          .name = "ucx",
          .lanes = options.lanes,
          .one_sided = true,
          .gpu_memory = false,
          .max_write_bytes = options.max_write_bytes,
          .max_inflight_bytes_per_endpoint = options.max_inflight_bytes_per_endpoint,
          // Writes in the kernel's socket buffers or the peer's FIFO outlive a force close.
          .disconnect_fences = false,
      },
      connect_timeout_(options.connect_timeout) {}

absl::Status UcxTransport::Init(const UcxOptions& options) {
  if (TlsMayUse(options.tls, {"sm", "posix", "sysv", "mm"})) EnableSharedMemoryPeerFailure();
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FromUcs(s, "ucx: ucp_config_read");
  if (!options.tls.empty() &&
      (s = ucp_config_modify(config, "TLS", options.tls.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx options: tls \"%s\" was rejected by UCX: %s", options.tls, Ucs(s)));
  }
  if (!options.net_devices.empty() &&
      (s = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: net_devices \"%s\" was rejected by UCX: %s", options.net_devices, Ucs(s)));
  }
  // Allocate wants UCX's posix segments, which another process maps through an fd, before its
  // SysV ones, which no fd names (UCX's default order is sysv first).
  if (std::getenv("UCX_ALLOC_PRIO") == nullptr &&
      (s = ucp_config_modify(config, "ALLOC_PRIO", "md:posix,md:sysv,huge,thp,md:*,mmap,heap")) !=
          UCS_OK) {
    ucp_config_release(config);
    return FromUcs(s, "ucx: setting ALLOC_PRIO");
  }
  // UCX takes a transport's settings by their name inside the transport ("TX_SEG_SIZE" for
  // UCX_TCP_TX_SEG_SIZE, applied to every transport that has it), and only when that transport
  // is loaded: it warns about the rest. The operator's environment wins over each of them.
  struct Setting {
    std::string key;
    std::string value;
    std::vector<std::string> env;  // the variables that name it
  };
  const bool tcp = TlsMayUse(options.tls, {"tcp"});
  std::vector<Setting> settings;
  if (tcp) {
    for (const auto& [name, value] : UcxTuningEnvironment(options)) {
      settings.push_back({name.substr(std::string("UCX_TCP_").size()), value, {name}});
    }
    // connect(2) without blocking: a blocking one to an unreachable host would hold the lane's
    // thread, and so every other peer's posts on that lane, through the kernel's SYN retries.
    settings.push_back({"CONN_NB", "y", {"UCX_TCP_CONN_NB"}});
  }
  if (options.keepalive_interval > absl::ZeroDuration()) {
    const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(options.keepalive_interval));
    settings.push_back({"KEEPALIVE_INTERVAL", absl::StrCat(ms, "ms"), {"UCX_KEEPALIVE_INTERVAL"}});
    if (tcp) {
      const std::string seconds = absl::StrCat(std::max<int64_t>(1, (ms + 999) / 1000), "s");
      settings.push_back({"KEEPIDLE", seconds, {"UCX_TCP_KEEPIDLE"}});
      settings.push_back({"KEEPINTVL", seconds, {"UCX_TCP_KEEPINTVL"}});
    }
  }
  for (const Setting& setting : settings) {
    if (std::any_of(setting.env.begin(), setting.env.end(),
                    [](const std::string& name) { return std::getenv(name.c_str()) != nullptr; })) {
      continue;
    }
    if ((s = ucp_config_modify(config, setting.key.c_str(), setting.value.c_str())) != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, absl::StrFormat("ucx: setting %s=%s", setting.env[0], setting.value));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  params.mt_workers_shared = 1;  // workers of different lanes run at once
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrFormat("ucx: ucp_init with tls \"%s\"", options.tls));
  }
  context_ = context;
  // Over tcp UCX's puts can kill the target (see "Writes over tcp" in the header): writes go as
  // active messages of one tcp segment (less UCX's and our headers) wherever tcp may carry them.
  am_writes_ = tcp;
  uint64_t segment = options.tcp_tx_seg_bytes;
  if (const char* env = std::getenv("UCX_TCP_TX_SEG_SIZE"); env != nullptr) {
    segment = ParseUcxBytes(env);
  }
  if (segment == 0) segment = uint64_t{8} << 10;  // UCX's default
  am_slice_bytes_ = std::max<uint64_t>(segment, uint64_t{2} << 10) - 512;
  for (int index = 0; index < options.lanes; ++index) {
    auto lane = std::make_unique<Lane>();
    lane->index = index;
    lane->transport = this;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Serialised: Init (this thread) sets it up, then only the lane's thread calls into it.
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    s = ucp_worker_create(context, &wp, &lane->worker);
    if (s != UCS_OK) {
      return FromUcs(s, absl::StrFormat("ucx: ucp_worker_create for lane %d", index));
    }
    Lane& added = *lanes_.emplace_back(std::move(lane));
    // Every lane serves both sides of the active-message path: a peer may write either way.
    const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
        {am::kWriteAm,
         [](void* arg, const void* header, size_t header_length, void* data, size_t length,
            const ucp_am_recv_param_t* param) {
           return static_cast<ucs_status_t>(
               OnWriteAm(arg, header, header_length, data, length, param));
         }},
        {am::kWritesAm,
         [](void* arg, const void* header, size_t header_length, void* data, size_t length,
            const ucp_am_recv_param_t* param) {
           return static_cast<ucs_status_t>(
               OnWritesAm(arg, header, header_length, data, length, param));
         }},
        {am::kFlushAm, OnFlushAm},
        {am::kFlushReplyAm, OnFlushReplyAm},
        {am::kByeAm, OnByeAm},
    };
    for (const auto& [id, callback] : handlers) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.flags = UCP_AM_FLAG_WHOLE_MSG;
      hp.cb = callback;
      hp.arg = &added;
      s = ucp_worker_set_am_recv_handler(added.worker, &hp);
      if (s != UCS_OK) {
        return FromUcs(s,
                       absl::StrFormat("ucx: ucp_worker_set_am_recv_handler for lane %d", index));
      }
    }
    ucp_address_t* address = nullptr;
    size_t length = 0;
    s = ucp_worker_get_address(added.worker, &address, &length);
    if (s != UCS_OK) {
      return FromUcs(s, absl::StrFormat("ucx: ucp_worker_get_address for lane %d", index));
    }
    added.address.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(added.worker, address);
  }
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  Close();
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

absl::StatusOr<RegionId> UcxTransport::Register(const LocalRegion& region) {
  KVRAIL_RETURN_IF_ERROR(CheckLocalRegion(region, capabilities_.gpu_memory));
  const uint64_t base = reinterpret_cast<uintptr_t>(region.base);
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Register: the transport is closed");
  KVRAIL_RETURN_IF_ERROR(regions_.CheckDisjoint(region));
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = region.base;
  mp.length = region.length;
  auto state = std::make_unique<RegionState>();
  ucs_status_t s = ucp_mem_map(static_cast<ucp_context_h>(context_), &mp, &state->memh);
  if (s != UCS_OK) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region [0x%x, +%u): ucp_mem_map failed: %s", base, region.length, Ucs(s)));
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  s = ucp_rkey_pack(static_cast<ucp_context_h>(context_), state->memh, &packed, &packed_size);
  if (s != UCS_OK) {
    ucp_mem_unmap(static_cast<ucp_context_h>(context_), state->memh);
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region [0x%x, +%u): ucp_rkey_pack failed: %s", base, region.length, Ucs(s)));
  }
  state->rkey.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  AllLanes writing(lanes_);
  return regions_.Add(base, region.length, std::move(state));
}

absl::StatusOr<SharedRegion> UcxTransport::Allocate(uint64_t length) {
  if (length == 0) {
    return absl::InvalidArgumentError("Allocate: length is 0; at least 1 byte is needed");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Allocate: the transport is closed");
    auto context = static_cast<ucp_context_h>(context_);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = nullptr;
    mp.length = length;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    auto state = std::make_unique<RegionState>();
    if (ucp_mem_map(context, &mp, &state->memh) == UCS_OK) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      absl::StatusOr<BackingFd> backing = absl::UnknownError("ucp_mem_query failed");
      if (ucp_mem_query(state->memh, &attr) == UCS_OK && attr.length >= length) {
        backing = FindBackingFd(attr.address);
      }
      void* packed = nullptr;
      size_t packed_size = 0;
      // Only a UCX segment that another process can open is the "ucx-shm" placement; memory
      // UCX took from mmap or the heap (no shared-memory transport loaded) is given back.
      if (backing.ok() && backing->contiguous >= length &&
          (state->shared_fd = fcntl(backing->fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
          ucp_rkey_pack(context, state->memh, &packed, &packed_size) == UCS_OK) {
        state->rkey.assign(static_cast<const char*>(packed), packed_size);
        ucp_rkey_buffer_release(packed);
        const int shared_fd = state->shared_fd;
        AllLanes writing(lanes_);
        SharedRegion shared{.region = regions_.Add(reinterpret_cast<uintptr_t>(attr.address),
                                                   length, std::move(state)),
                            .base = attr.address,
                            .length = length,
                            .fd = shared_fd,
                            .fd_offset = backing->offset,
                            .placement = "ucx-shm"};
        return shared;
      }
      state->Release(context);
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(MemfdAllocation allocation, AllocateOnMemfd(*this, length));
  std::lock_guard<std::mutex> lock(mu_);
  allocated_.emplace(allocation.shared.region, std::move(allocation.arena));
  return allocation.shared;
}

absl::Status UcxTransport::Deregister(RegionId region) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Deregister: the transport is closed");
  if (regions_.Find(region) == nullptr) return RegionNotRegistered(region);
  {
    AllLanes writing(lanes_);  // no post checks, no lane sends from or copies into it now
    KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<RegionState> removed, regions_.Remove(region));
    removed->Release(static_cast<ucp_context_h>(context_));
  }
  if (auto owned = allocated_.find(region); owned != allocated_.end()) allocated_.erase(owned);
  return absl::OkStatus();
}

absl::StatusOr<v1::HandshakeDescriptor> UcxTransport::LocalDescriptor() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("LocalDescriptor: the transport is closed");
  v1::HandshakeDescriptor descriptor;
  descriptor.set_version(regions_.version());
  descriptor.set_transport(v1::TRANSPORT_KIND_UCX);
  for (const auto& lane : lanes_) descriptor.add_lanes()->set_address(lane->address);
  for (const auto& [id, entry] : regions_) {
    v1::Region* region = descriptor.add_regions();
    region->set_base(entry.base);
    region->set_length(entry.length);
    region->set_remote_key(entry.entry->rkey);
    region->set_memory_kind(v1::MEMORY_KIND_HOST);
  }
  return descriptor;
}

absl::StatusOr<PeerId> UcxTransport::Connect(const v1::HandshakeDescriptor& peer) {
  KVRAIL_RETURN_IF_ERROR(CheckPeerKind(peer, v1::TRANSPORT_KIND_UCX, "ucx"));
  for (int i = 0; i < peer.lanes_size(); ++i) {
    if (peer.lanes(i).address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("peer descriptor: lane %d has an empty UCX worker address", i));
    }
  }
  for (int i = 0; i < peer.regions_size(); ++i) {
    if (peer.regions(i).remote_key().empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("peer descriptor: region %d has an empty UCX remote key", i));
    }
  }
  KVRAIL_ASSIGN_OR_RETURN(RemoteRegions regions, RemoteRegions::FromDescriptor(peer));
  const int lanes = capabilities_.lanes;
  auto state = std::make_shared<PeerState>(std::move(regions), lanes, peer.regions_size());
  state->name = PeerName(peer);
  for (int index = 0; index < lanes; ++index) {
    state->remote_addresses.push_back(peer.lanes(index % peer.lanes_size()).address());
  }
  for (int r = 0; r < peer.regions_size(); ++r) {
    state->remote_keys.push_back(peer.regions(r).remote_key());
    state->remote_bases.push_back(peer.regions(r).base());
    state->remote_lengths.push_back(peer.regions(r).length());
  }
  state->mapped.assign(peer.regions_size(), 0);
  state->mapped_delta.assign(peer.regions_size(), 0);
  state->prefault.resize(peer.regions_size());
  auto wait = std::make_shared<ConnectWait>();
  wait->pending = lanes;
  state->connect_wait = wait;
  {
    // Every lane's thread creates the peer's endpoint and starts UCX's wireup on its own worker
    // (IssueConnect); this thread only queues the jobs, then waits holding no lock (see the
    // header). The id is taken now, before any lane can name the peer in a message; a Connect
    // that fails leaves its id unused.
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("Connect: the transport is closed");
    state->id = next_peer_++;
    connecting_.push_back(state);
    for (auto& lane : lanes_) {
      std::lock_guard<std::mutex> queue(lane->mu);
      lane->PushLocked(lane->TakeOpLocked(), *state, OpKind::kConnect, {});
    }
  }
  bool timed_out = false;
  absl::Status failure;
  {
    std::unique_lock<std::mutex> lock(wait->mu);
    timed_out = !wait->changed.wait_for(lock, absl::ToChronoNanoseconds(connect_timeout_),
                                        [&wait] { return wait->pending == 0; });
    if (!timed_out) failure = wait->failure;
  }
  std::lock_guard<std::mutex> lock(mu_);
  AllLanes writing(lanes_);
  connecting_.erase(std::find(connecting_.begin(), connecting_.end(), state));
  if (closed_) {
    ClosePeer(state, "the transport was closed");  // done already by Close, unless raced
    return absl::FailedPreconditionError(
        absl::StrCat("Connect to ", state->name, ": the transport was closed while connecting"));
  }
  if (failure.ok() && timed_out) {
    failure = absl::DeadlineExceededError(absl::StrCat(
        "Connect to ", state->name, ": UCX's wireup with the peer's lanes did not finish within ",
        absl::FormatDuration(connect_timeout_), " (is the peer stopped or unreachable?)"));
  }
  if (!failure.ok()) {
    ClosePeer(state, "connect failed");
    return failure;
  }
  const PeerId id = state->id;
  peers_.emplace(id, std::move(state));
  return id;
}

void UcxTransport::IssueConnect(Lane& lane, Op* op) {
  PeerState& state = *op->peer;
  const int index = lane.index;
  PeerLane& pl = state.lanes[index];
  std::shared_ptr<ConnectWait> wait = state.connect_wait;
  // Ends the job without a wireup: Connect hears `status` from this lane.
  const auto fail = [&](absl::Status status) {
    lane.Recycle(op);
    wait->Done(std::move(status));
  };
  if (state.closed) {
    fail(absl::CancelledError(absl::StrFormat("Connect to %s: lane %d: %s before it was connected",
                                              state.name, index, state.why)));
    return;
  }
  const int remote_lane = index % static_cast<int>(state.remote_addresses.size());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(state.remote_addresses[index].data());
  ep.err_handler.cb = OnEndpointError;
  ep.err_handler.arg = &pl;
  // Peer-failure handling wherever UCX has it (tcp, and shared memory as Init configures it);
  // where it has none, the transport falls back, once, to no error handling.
  ep.err_mode = peer_errors_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ucs_status_t s = ucp_ep_create(lane.worker, &ep, &pl.ep);
  if (s == UCS_ERR_UNREACHABLE && ep.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
    peer_errors_ = false;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(lane.worker, &ep, &pl.ep);
  }
  if (s != UCS_OK) {
    pl.ep = nullptr;
    fail(absl::UnavailableError(
        absl::StrFormat("Connect to %s: lane %d: ucp_ep_create to peer lane %d failed: %s",
                        state.name, index, remote_lane, Ucs(s))));
    return;
  }
  pl.peer_mode = ep.err_mode == UCP_ERR_HANDLING_MODE_PEER;
  for (size_t r = 0; r < state.remote_keys.size(); ++r) {
    s = ucp_ep_rkey_unpack(pl.ep, state.remote_keys[r].data(), &pl.rkeys[r]);
    if (s != UCS_OK) {
      pl.rkeys[r] = nullptr;
      fail(absl::InvalidArgumentError(absl::StrFormat(
          "peer descriptor: region %d: remote key is not a UCX rkey this transport can use "
          "(ucp_ep_rkey_unpack: %s)",
          r, Ucs(s))));
      return;
    }
  }
  if (index == 0) MapRegions(state);
  lane.outbound[pl.writer.token()] = &state;
  // UCX's wireup finishes with a flush of the new endpoint, progressed by this thread: an
  // unreachable peer is reported by Connect, and no wireup message is left pending when either
  // side's worker is destroyed (UCX 1.13 asserts on a pending wireup reply at
  // ucp_worker_destroy). The job becomes that flush.
  op->kind = OpKind::kFlush;
  op->done = [wait, index, name = state.name](absl::Status status) {
    if (!status.ok()) {
      status = absl::Status(
          status.code(), absl::StrFormat("Connect to %s: lane %d: the peer's worker could not be "
                                         "reached (wireup: %s)",
                                         name, index, status.message()));
    }
    wait->Done(std::move(status));
  };
  pl.ops.push_back(op);
  StartFlush(lane, pl.ep, op, "ucp_ep_flush_nbx");
}

absl::StatusOr<PeerState*> UcxTransport::FindPeerLocked(PeerId peer, int lane) const {
  if (closed_) return absl::FailedPreconditionError("the transport is closed");
  KVRAIL_RETURN_IF_ERROR(CheckLane(lane, capabilities_.lanes));
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("peer %d is not connected (never connected, or disconnected)", peer));
  }
  return it->second.get();
}

absl::StatusOr<UcxTransport::Started> UcxTransport::Start(
    PeerId peer, int lane, const Completion& done, absl::FunctionRef<std::string()> context) {
  if (!done) return absl::InvalidArgumentError(context() + ": the completion is empty");
  if (absl::Status checked = CheckLane(lane, capabilities_.lanes); !checked.ok()) {
    return AddContext(checked, context());
  }
  // Only this lane's queue mutex: writers of the peers and regions hold every lane's
  // (AllLanes), so lanes post at once and nothing they share is written on the way; and the
  // lane's thread holds it only to take its jobs, never across a UCX call.
  Lane& home = *lanes_[lane];
  std::unique_lock<std::mutex> lock(home.mu);
  auto found = FindPeerLocked(peer, lane);
  if (!found.ok()) return AddContext(found.status(), context());
  return Started{std::move(lock), &home, *found};
}

absl::Status UcxTransport::PostWrites(PeerId peer, int lane, RegionId source,
                                      absl::Span<const Write> writes, Completion done) {
  // Formatted only on the way to an error: posting is the hot path.
  const auto context = [&] { return BatchContext(peer, lane, source); };
  KVRAIL_ASSIGN_OR_RETURN(Started started, Start(peer, lane, done, context));
  Lane& home = *started.home;
  const auto* region = regions_.Find(source);
  if (region == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("%s: source region %d is not registered", context(), source));
  }
  // Checked here, so that a bad batch is refused at once; the lane's thread sends it as it is.
  Op* op = home.TakeOpLocked();
  if (absl::Status checked = CheckWrites(writes, region->length, started.state->regions,
                                         capabilities_.max_write_bytes, &op->region_of);
      !checked.ok()) {
    op->region_of.clear();
    home.spare.emplace_back(op);
    return AddContext(checked, context());
  }
  op->source = source;
  op->base = reinterpret_cast<const std::byte*>(region->base);
  op->writes.assign(writes.begin(), writes.end());
  home.PushLocked(op, *started.state, OpKind::kBatch, std::move(done));
  return absl::OkStatus();
}

absl::Status UcxTransport::Flush(PeerId peer, int lane, Completion done) {
  const auto context = [&] { return FlushContext(peer, lane); };
  KVRAIL_ASSIGN_OR_RETURN(Started started, Start(peer, lane, done, context));
  Lane& home = *started.home;
  home.PushLocked(home.TakeOpLocked(), *started.state,
                  am_writes_ ? OpKind::kAmFlush : OpKind::kFlush, std::move(done));
  return absl::OkStatus();
}

void UcxTransport::Issue(Lane& lane, Op* op) {
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
  // A peer closed while this waited in the queue: cancelled, never sent (its close job is
  // queued behind it).
  if (state.closed) {
    lane.Finish(op, Cancellation(*op, state.why));
    return;
  }
  if (pl.failed != UCS_OK) {
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
    if (am_writes_) {
      SendAmFlush(lane, pl, op);
    } else {
      StartFlush(lane, pl.ep, op, FlushContext(state.id, lane.index) + ": ucp_ep_flush_nbx");
    }
    return;
  }
  // Deregister withdrew the source while the batch waited: its bytes are not touched.
  if (regions_.Find(op->source) == nullptr) {
    lane.Finish(op, absl::CancelledError(absl::StrFormat(
                        "%s: the source region was deregistered before the batch was sent",
                        BatchContext(state.id, lane.index, op->source))));
    return;
  }
  Lane::Hold(op);
  if (am_writes_) {
    IssueAmWrites(lane, pl, op);
  } else {
    ucp_request_param_t param = RequestParam(op);
    const size_t count = op->writes.size();
    bool stored = false;
    for (size_t i = 0; i < count; ++i) {
      const Write& w = op->writes[i];
      // Into a region UCX maps here, a write is a plain store on this thread, as UCX's own put
      // into such memory would be, without a UCX call per write (a head-sliced room's rows are
      // a KiB each).
      if (std::byte* to = MappedAddress(state, op->region_of[i], w.remote_address)) {
        state.prefault[op->region_of[i]]->Before(to, w.length);
        LandingCopy(to, op->base + w.local_offset, w.length);
        stored = true;
        continue;
      }
      ucs_status_ptr_t request = ucp_put_nbx(pl.ep, op->base + w.local_offset, w.length,
                                             w.remote_address, pl.rkeys[op->region_of[i]], &param);
      if (request == nullptr) continue;
      if (UCS_PTR_IS_ERR(request)) {
        op->status = PostFailure(
            request, absl::StrFormat("%s: write %d of %d: ucp_put_nbx",
                                     BatchContext(state.id, lane.index, op->source), i, count));
        break;
      }
      ++op->requests;
    }
    // The stores are visible to the peer before anything this lane does next (a flush's answer,
    // the caller's status message) can be.
    if (stored) LandingFence();
  }
  if (lane.Release(op) && op->requests == 0) lane.Finish(op, op->status);
}

void UcxTransport::MapRegions(PeerState& state) {
  const PeerLane& pl = state.lanes[0];
  for (size_t r = 0; r < pl.rkeys.size(); ++r) {
    void* local = nullptr;
    const uint64_t base = state.remote_bases[r];
    if (pl.rkeys[r] == nullptr || ucp_rkey_ptr(pl.rkeys[r], base, &local) != UCS_OK) continue;
    state.mapped[r] = 1;
    state.mapped_delta[r] = reinterpret_cast<intptr_t>(local) - static_cast<intptr_t>(base);
    state.prefault[r] =
        std::make_unique<Prefaulter>(static_cast<std::byte*>(local), state.remote_lengths[r]);
  }
}

std::byte* UcxTransport::MappedAddress(const PeerState& state, int region, uint64_t address) {
  if (state.mapped[region] == 0) return nullptr;
  return reinterpret_cast<std::byte*>(static_cast<intptr_t>(address) + state.mapped_delta[region]);
}

void UcxTransport::IssueAmWrites(Lane& lane, PeerLane& pl, Op* op) {
  am::PlanMessages(op->writes, am_slice_bytes_, &op->plan);
  // UCX reads headers, entries and gather lists until each send completes: none may move.
  const am::PlanSizes sizes = am::SizesOf(op->plan);
  op->headers.reserve(sizes.headers);
  op->packed.reserve(sizes.packed);
  op->gather.reserve(sizes.gather);
  ucp_request_param_t param = RequestParam(op);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  // Eager: the target gets each message whole inside its progress and never has to ask for it
  // (a rendezvous would make the target send); reply: the target answers flushes through it.
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  ucp_request_param_t gathered = param;
  gathered.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  gathered.datatype = ucp_dt_make_iov();
  for (const am::AmMessage& message : op->plan) {
    am::AmHeader& header = op->headers.emplace_back(pl.writer.WriteHeader(message, op->writes));
    ucs_status_ptr_t request;
    if (message.id == am::kWritesAm) {
      // One gather list: the entry table, then each write's source bytes.
      const size_t first_entry = op->packed.size();
      const size_t first_iov = op->gather.size();
      op->gather.push_back({nullptr, (message.end - message.first) * sizeof(am::PackedWrite)});
      for (size_t k = message.first; k < message.end; ++k) {
        const Write& small_write = op->writes[k];
        op->packed.push_back({small_write.remote_address, small_write.length});
        op->gather.push_back(
            {const_cast<std::byte*>(op->base + small_write.local_offset), small_write.length});
      }
      op->gather[first_iov].buffer = &op->packed[first_entry];
      request = ucp_am_send_nbx(pl.ep, am::kWritesAm, &header, sizeof(header),
                                &op->gather[first_iov], message.end - message.first + 1, &gathered);
    } else {
      const Write& w = op->writes[message.first];
      request = ucp_am_send_nbx(pl.ep, am::kWriteAm, &header, sizeof(header),
                                op->base + w.local_offset + message.offset, message.length, &param);
    }
    if (UCS_PTR_IS_ERR(request)) {
      op->status =
          PostFailure(request, absl::StrFormat("%s: write %d of %d: ucp_am_send_nbx",
                                               BatchContext(pl.peer->id, lane.index, op->source),
                                               message.first, op->writes.size()));
      return;
    }
    pl.writer.Sent();
    if (request != nullptr) ++op->requests;
  }
}

void UcxTransport::SendAmFlush(Lane& lane, PeerLane& pl, Op* op) {
  const am::AmHeader& header = op->headers.emplace_back(pl.writer.NextFlush());
  op->seq = header.b;
  ucp_request_param_t param = RequestParam(op);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  Lane::Hold(op);
  ucs_status_ptr_t request =
      ucp_am_send_nbx(pl.ep, am::kFlushAm, &header, sizeof(header), nullptr, 0, &param);
  if (UCS_PTR_IS_PTR(request)) ++op->requests;
  if (!lane.Release(op)) return;
  if (UCS_PTR_IS_ERR(request)) {
    lane.FinishFlush(
        op, PostFailure(request, FlushContext(pl.peer->id, lane.index) + ": ucp_am_send_nbx"));
  }
}

// Where an active-message write lands at the target: memory this transport has registered
// now, read on the lane's thread holding its worker mutex.
class UcxTransport::RegisteredMemory final : public am::AmLanding {
 public:
  explicit RegisteredMemory(const UcxTransport& transport) : transport_(transport) {}
  bool Registered(uint64_t address, uint64_t length) const override {
    return transport_.RegisteredLocked(address, length);
  }
  void Copy(uint64_t address, const std::byte* bytes, uint64_t length) override {
    LandingCopy(reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address)), bytes, length);
  }
  void Fence() override { LandingFence(); }

 private:
  const UcxTransport& transport_;
};

bool UcxTransport::RegisteredLocked(uint64_t address, uint64_t length) const {
  return regions_.Covering(address, length).has_value();
}

int UcxTransport::OnWriteAm(void* arg, const void* header, size_t header_length, void* data,
                            size_t length, const void* param_ptr) {
  return OnWriteMessage(am::kWriteAm, arg, header, header_length, data, length, param_ptr);
}

int UcxTransport::OnWritesAm(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const void* param_ptr) {
  return OnWriteMessage(am::kWritesAm, arg, header, header_length, data, length, param_ptr);
}

int UcxTransport::OnWriteMessage(unsigned id, void* arg, const void* header, size_t header_length,
                                 void* data, size_t length, const void* param_ptr) {
  const auto* param = static_cast<const ucp_am_recv_param_t*>(param_ptr);
  am::AmHeader parsed;
  if (!am::ReadHeader(header, header_length, &parsed)) return UCS_OK;
  Lane& lane = *static_cast<Lane*>(arg);
  RegisteredMemory landing(*lane.transport);
  // A rendezvous never comes from a kvrail writer (eager only).
  const bool whole = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0;
  const ucp_ep_h reply_ep = ReplyEndpoint(param);
  const ReplyThrough send(reply_ep);
  const am::Reply reply(send);
  const auto* bytes = static_cast<const std::byte*>(data);
  if (id == am::kWritesAm) {
    lane.target.OnWrites(parsed, bytes, length, whole, landing,
                         reply_ep != nullptr ? &reply : nullptr);
  } else {
    lane.target.OnWrite(parsed, bytes, length, whole, landing,
                        reply_ep != nullptr ? &reply : nullptr);
  }
  return UCS_OK;
}

void UcxTransport::ClosePeer(const std::shared_ptr<PeerState>& peer, const char* why) {
  if (peer->closed) return;
  peer->closed = true;
  peer->why = why;
  for (auto& lane : lanes_) {
    if (lane->stop) continue;  // torn down already: it has no endpoint of any peer
    Op* job = lane->TakeOpLocked();
    job->closing = peer;
    lane->PushLocked(job, *peer, OpKind::kClose, {});
  }
}

void UcxTransport::IssueClose(Lane& lane, Op* job) {
  std::shared_ptr<PeerState> peer = std::move(job->closing);
  lane.Recycle(job);
  const int index = lane.index;
  PeerLane& pl = peer->lanes[index];
  while (!pl.ops.empty()) lane.Finish(pl.ops.front(), Cancellation(*pl.ops.front(), peer->why));
  lane.outbound.erase(pl.writer.token());
  if (pl.ep == nullptr) {
    peer->DestroyRkeys(index);
    return;
  }
  if (am_writes_ && pl.failed == UCS_OK) {
    SendOwnedAm(pl.ep, am::kByeAm, new am::AmHeader{.token = pl.writer.token()});
  }
  // A force close (see "Fencing" in the header): UCX drops what it still queues for the peer
  // and sends nothing more. UCX allows it only on endpoints with peer-failure handling; the
  // others close flushing. The lane's rkeys go once its endpoint is closed.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = pl.peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(pl.ep, &param);
  pl.ep = nullptr;
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    lane.closing.emplace_back(request, std::move(peer));
  } else {
    peer->DestroyRkeys(index);
  }
}

absl::Status UcxTransport::Disconnect(PeerId peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return absl::FailedPreconditionError("Disconnect: the transport is closed");
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "Disconnect: peer %d is not connected (never connected, or disconnected)", peer));
  }
  // Every lane's worker mutex: no lane is sending for the peer while it is marked closed, and
  // from then on each sends nothing more for it (see "Fencing" in the header).
  AllLanes writing(lanes_);
  std::shared_ptr<PeerState> state = std::move(it->second);
  peers_.erase(it);
  ClosePeer(state, "the peer was disconnected");
  return absl::OkStatus();
}

bool UcxTransport::OnLaneThread() const {
  const std::thread::id self = std::this_thread::get_id();
  return std::find(lane_threads_.begin(), lane_threads_.end(), self) != lane_threads_.end();
}

void UcxTransport::RunLane(Lane& lane) {
  // Named for top -H, perf and gdb: "ucx-lane0", "ucx-lane1", ...
  pthread_setname_np(pthread_self(), absl::StrFormat("ucx-lane%d", lane.index).c_str());
  int idle = 0;
  constexpr int kDeliveriesPerProgress = 8;
  int unpolled = 0;               // delivery rounds since the last progress
  std::vector<Op*> jobs;          // keeps its capacity from round to round, as does
  std::vector<Ready> delivering;  // this one
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
      // In the order they were queued: a lane's flush follows the batches it covers.
      for (Op* job : jobs) Issue(lane, job);
      issued = jobs.size();
      jobs.clear();
      if (stop) {
        TearDown(lane);
      } else {
        // Completions delivered last round may have posted puts that finished at once (over
        // shared memory a put is a copy, done before ucp_put_nbx returns): deliver those before
        // polling UCX again, polling at least every kDeliveriesPerProgress rounds so that
        // flushes, wireup and peers' messages still move. Polling once per post, perf put about
        // 8 % of a lane's time in ucp_worker_progress at 64 KiB writes over shm.
        if (lane.ready.empty() || ++unpolled >= kDeliveriesPerProgress) {
          unpolled = 0;
          events = ProgressWorker(lane.worker);
        }
        if (!lane.closing.empty()) lane.ReapClosed();
      }
    }
    // No lock held: a completion may post, flush, register, disconnect or close.
    const bool delivered = !lane.ready.empty();
    if (delivered) {
      delivering.swap(lane.ready);
      for (Ready& r : delivering) r.done(std::move(r.status));
      delivering.clear();  // destroys the callables
    }
    if (stop) return;
    if (events > 0 || issued > 0 || delivered) {
      idle = 0;
      continue;
    }
    // Back off when idle: spin a little, then sleep up to 1 ms; a new job wakes us at once.
    if (++idle < 64) {
      std::this_thread::yield();
      continue;
    }
    const auto nap = std::chrono::microseconds(std::min(1000, 10 * (idle - 63)));
    std::unique_lock<std::mutex> queue(lane.mu);
    lane.changed.wait_for(queue, nap, [&lane] { return !lane.jobs.empty() || lane.stop; });
  }
}

void UcxTransport::TearDown(Lane& lane) {
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

void UcxTransport::ReleaseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) return;
  released_ = true;
  for (auto& region : regions_.TakeAll()) region->Release(static_cast<ucp_context_h>(context_));
  allocated_.clear();
  // A lane whose thread never started (Create failed) still has its worker.
  for (auto& lane : lanes_) {
    if (lane->worker != nullptr) ucp_worker_destroy(lane->worker);
    lane->worker = nullptr;
  }
}

void UcxTransport::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    AllLanes writing(lanes_);
    if (!closed_) {
      closed_ = true;
      for (auto& [id, peer] : peers_) ClosePeer(peer, "the transport was closed");
      peers_.clear();
      // Their Connects wake up (their wireup is cancelled) and say the transport closed.
      for (auto& peer : connecting_) ClosePeer(peer, "the transport was closed");
    }
    // Behind the close jobs: each lane's thread cancels and closes, then tears down.
    for (auto& lane : lanes_) {
      lane->stop = true;
      lane->changed.notify_all();
    }
  }
  // From a completion a lane's thread cannot join itself: every lane tears itself down and
  // delivers what is left, and the destructor (which calls Close again) joins and releases.
  if (OnLaneThread()) return;
  std::lock_guard<std::mutex> join(join_mu_);
  for (auto& lane : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
  }
  ReleaseAll();
}

}  // namespace kvrail::transport
