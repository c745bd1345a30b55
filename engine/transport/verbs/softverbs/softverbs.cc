// The softverbs provider: objects, the per-process NIC thread, requester and responder.
#include "engine/transport/verbs/softverbs/softverbs.h"

#include <errno.h>
#include <net/if.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "engine/base/sanitizers.h"
#include "engine/sync/mutex.h"
#include "engine/sync/shared_mutex.h"
#include "engine/transport/verbs/softverbs/rails.h"
#include "engine/transport/verbs/softverbs/wire.h"

#if KVRAIL_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace kvrail::transport::softverbs {
namespace {

// The responder's copy into a registered region stands for a NIC's DMA write, which no CPU
// thread performs: the application learns of it out of band (a message from the requester,
// possibly in another process), so ThreadSanitizer must not attribute it to the NIC thread.
void DmaWrite(void* dst, const void* src, size_t n) {
#if KVRAIL_TSAN
  __tsan_ignore_thread_begin();
#endif
  std::memcpy(dst, src, n);
#if KVRAIL_TSAN
  __tsan_ignore_thread_end();
#endif
}

constexpr uint32_t kMaxQpWr = 4096;
constexpr uint32_t kMaxSge = 16;
constexpr uint32_t kMaxInline = 256;
constexpr int kMaxCqe = 1 << 16;
// The retry budget never goes below this, so that sanitizer builds on a loaded 2-core machine
// do not time out live connections.
constexpr absl::Duration kMinRetryBudget = absl::Milliseconds(50);
// How long a fence waits for a copy the responder already started.
constexpr absl::Duration kFenceWait = absl::Milliseconds(200);
constexpr absl::Duration kPeerCheckEvery = absl::Milliseconds(10);

struct Pd;
struct Cq;

struct Device {
  ibv_device ibv;
  Rail rail;
};

struct Context {
  ibv_context ibv;
  Rail rail;
};

struct Pd {
  ibv_pd ibv;
  int users = 0;  // MRs and QPs; guarded by Nic::mu.
};

struct Mr {
  ibv_mr ibv;
  int access = 0;
  Pd* pd = nullptr;
};

struct Channel {
  ibv_comp_channel ibv;
  kvrail::Mutex mu;
  std::deque<Cq*> events ABSL_GUARDED_BY(mu);
  int users = 0;  // CQs; guarded by Nic::mu.
};

struct Cq {
  ibv_cq ibv;
  kvrail::Mutex mu;
  std::deque<ibv_wc> wcs ABSL_GUARDED_BY(mu);
  bool armed ABSL_GUARDED_BY(mu) = false;
  bool overrun ABSL_GUARDED_BY(mu) = false;
  Channel* channel = nullptr;
  int users = 0;  // QPs; guarded by Nic::mu.
};

// One send work request as the send queue holds it.
struct Wqe {
  uint64_t wr_id = 0;
  bool signaled = false;
  std::vector<ibv_sge> sges;
  std::vector<unsigned char> inline_data;
  bool is_inline = false;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  uint64_t len = 0;
  uint64_t seq = 0;
  uint64_t sent = 0;
  bool started = false;
  bool tx_done = false;
  bool acked = false;
  absl::Time ready_at = absl::InfinitePast();
  // Not IBV_WC_SUCCESS: the WR completes with this status when it reaches the front, without
  // sending anything (a bad local SGE, an injected error, a NAK).
  ibv_wc_status forced = IBV_WC_SUCCESS;
};

struct Qp {
  ibv_qp ibv;  // First: the ibv_qp* handed out is this object's address.
  kvrail::Mutex mu;
  Context* ctx = nullptr;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  uint32_t qpn = 0;
  wire::Segment* seg = nullptr;  // Our own segment, mapped for the QP's lifetime.
  uint32_t max_send_wr = 0;
  uint32_t max_sge = 0;
  uint32_t max_inline = 0;
  bool sig_all = false;

  ibv_qp_state state ABSL_GUARDED_BY(mu) = IBV_QPS_RESET;
  bool destroyed ABSL_GUARDED_BY(mu) = false;
  // The connection (from RTR).
  uint32_t dest_qpn ABSL_GUARDED_BY(mu) = 0;
  wire::Segment* remote ABSL_GUARDED_BY(mu) = nullptr;  // The peer's segment, if reachable.
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  int64_t remote_pid ABSL_GUARDED_BY(mu) = 0;
  absl::Duration budget ABSL_GUARDED_BY(mu) = absl::InfiniteDuration();
  // The send queue: WRs not yet completed, in order; next_tx indexes the first not fully sent.
  std::deque<Wqe> sq ABSL_GUARDED_BY(mu);
  size_t next_tx ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 0;
  uint32_t sq_used ABSL_GUARDED_BY(mu) = 0;
  uint32_t unsignaled_done ABSL_GUARDED_BY(mu) = 0;
  absl::Time last_progress ABSL_GUARDED_BY(mu);
  absl::Time last_peer_check ABSL_GUARDED_BY(mu);
  // Responder: the message whose packets are being refused after a NAK.
  uint64_t refused_seq ABSL_GUARDED_BY(mu) = 0;

  ~Qp() {
    wire::UnmapSegment(remote);
    wire::UnmapSegment(seg);
  }
};

Qp* ToQp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
Cq* ToCq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
Context* ToCtx(ibv_context* c) { return reinterpret_cast<Context*>(c); }
Pd* ToPd(ibv_pd* p) { return reinterpret_cast<Pd*>(p); }
Mr* ToMr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
Channel* ToChannel(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }
Device* ToDevice(ibv_device* d) { return reinterpret_cast<Device*>(d); }

// The process's NIC: registries and the thread that moves data. Never destroyed, so that the
// thread and atexit handlers may use it until the process is gone.
class Nic {
 public:
  static Nic& Get() {
    static Nic* nic = new Nic;
    return *nic;
  }

  kvrail::Mutex mu;
  bool rails_loaded ABSL_GUARDED_BY(mu) = false;
  std::vector<Rail> rails ABSL_GUARDED_BY(mu);
  std::map<std::string, Device*> devices ABSL_GUARDED_BY(mu);  // Never freed.
  std::map<uint32_t, std::shared_ptr<Qp>> qps ABSL_GUARDED_BY(mu);
  bool thread_started ABSL_GUARDED_BY(mu) = false;

  // The MR table. The responder holds it (shared) while it checks and copies each packet, so
  // dereg_mr (exclusive) returns only once no copy into that memory is in progress.
  kvrail::SharedMutex mr_mu;
  std::unordered_map<uint32_t, Mr*> mrs ABSL_GUARDED_BY(mr_mu);
  uint32_t next_key ABSL_GUARDED_BY(mr_mu) = 0;

  kvrail::Mutex fault_mu;
  std::vector<Fault> faults ABSL_GUARDED_BY(fault_mu);
  std::set<std::string> down ABSL_GUARDED_BY(fault_mu);

  // The segments this process created (QP number -> creating pid), for the atexit cleanup.
  // A child forked without exec inherits the list but must not unlink its parent's segments.
  kvrail::Mutex names_mu;
  std::map<uint32_t, pid_t> names ABSL_GUARDED_BY(names_mu);

  kvrail::Mutex wake_mu;
  std::condition_variable wake_cv;
  bool kicked ABSL_GUARDED_BY(wake_mu) = false;

  void LoadRailsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (rails_loaded) return;
    rails_loaded = true;
    if (const char* env = std::getenv("KVRAIL_SOFTVERBS_RAILS")) rails = ParseRails(env);
    if (rails.empty()) rails.push_back(Rail{"softverbs0", "lo", 100});
  }

  bool RailUp(const Rail& rail) {
    {
      kvrail::MutexLock lock(&fault_mu);
      if (down.count(rail.device)) return false;
    }
    return rails::NetdevUp(rail.netdev);
  }

  // Consumes one count of a fault of `kind` that applies to `qpn`.
  bool TakeFault(FaultKind kind, uint32_t qpn, Fault* out) {
    kvrail::MutexLock lock(&fault_mu);
    for (auto it = faults.begin(); it != faults.end(); ++it) {
      if (it->kind != kind || (it->qp_num != 0 && it->qp_num != qpn)) continue;
      *out = *it;
      if (it->count > 0 && --it->count == 0) faults.erase(it);
      return true;
    }
    return false;
  }

  void Kick() {
    kvrail::MutexLock lock(&wake_mu);
    kicked = true;
    wake_cv.notify_one();
  }

  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (thread_started) return;
    thread_started = true;
    std::thread([this] { Run(); }).detach();
  }

  void Run();
  bool Requester(Qp& q);
  bool Responder(Qp& q);
};

void PushCompletion(Cq* cq, const ibv_wc& wc) {
  Channel* notify = nullptr;
  {
    kvrail::MutexLock lock(&cq->mu);
    if (cq->overrun) return;
    if (cq->wcs.size() >= static_cast<size_t>(cq->ibv.cqe)) {
      cq->overrun = true;  // See "CQ overrun" in softverbs.h.
      return;
    }
    cq->wcs.push_back(wc);
    if (cq->armed && cq->channel != nullptr) {
      cq->armed = false;
      notify = cq->channel;
      kvrail::MutexLock channel_lock(&notify->mu);
      notify->events.push_back(cq);
    }
  }
  if (notify != nullptr) {
    const uint64_t one = 1;
    (void)!write(notify->ibv.fd, &one, sizeof(one));
  }
}

void Complete(Qp& q, const Wqe& w, ibv_wc_status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  // A successful unsignalled WR gives no completion; its SQ slot is freed with the next WR that
  // does complete, as a real send queue frees the WQEs a CQE covers.
  if (status == IBV_WC_SUCCESS && !w.signaled) {
    ++q.unsignaled_done;
    return;
  }
  q.sq_used -= std::min(q.sq_used, 1 + q.unsignaled_done);
  q.unsignaled_done = 0;
  ibv_wc wc;
  std::memset(&wc, 0, sizeof(wc));
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RDMA_WRITE;
  wc.byte_len = static_cast<uint32_t>(w.len);
  wc.qp_num = q.qpn;
  PushCompletion(q.cq, wc);
}

// Stops every packet this QP sent from landing (see "Fencing" in softverbs.h).
void Fence(Qp& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  if (q.remote == nullptr) return;
  if (q.epoch == 0) return;  // Fenced already.
  // Bump the epoch only if it is still ours: a newer requester may have connected to the
  // responder since, and its epoch must stay valid.
  uint64_t expected = q.epoch;
  q.remote->inbound_epoch.compare_exchange_strong(expected, q.epoch + 1, std::memory_order_seq_cst);
  q.epoch = 0;
  // Dekker with the responder: it sets busy, then reads the epoch. Either it sees the new epoch
  // or we see busy set and wait for its copy to finish.
  const absl::Time deadline = absl::Now() + kFenceWait;
  while (q.remote->busy.load(std::memory_order_seq_cst) != 0 && absl::Now() < deadline &&
         !wire::ProcessIsDead(q.remote_pid)) {
    absl::SleepFor(absl::Microseconds(20));
  }
}

void Disconnect(Qp& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  Fence(q);
  wire::UnmapSegment(q.remote);
  q.remote = nullptr;
  q.dest_qpn = 0;
  q.remote_pid = 0;
}

void SetState(Qp& q, ibv_qp_state state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  q.state = state;
  q.ibv.state = state;
}

// Every outstanding WR completes with IBV_WC_WR_FLUSH_ERR, signalled or not.
void Flush(Qp& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  for (const Wqe& w : q.sq) Complete(q, w, IBV_WC_WR_FLUSH_ERR);
  q.sq.clear();
  q.next_tx = 0;
  q.sq_used = 0;
  q.unsignaled_done = 0;
}

void EnterError(Qp& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  Fence(q);
  SetState(q, IBV_QPS_ERR);
  Flush(q);
}

// The front WR fails with `status`; the QP goes to the error state, as on RC.
void FailFront(Qp& q, ibv_wc_status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  Fence(q);
  Wqe w = std::move(q.sq.front());
  q.sq.pop_front();
  if (q.next_tx > 0) --q.next_tx;
  Complete(q, w, status);
  SetState(q, IBV_QPS_ERR);
  Flush(q);
}

bool HasUnacked(const Qp& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q.mu) {
  for (const Wqe& w : q.sq) {
    if (!w.acked) return true;
  }
  return false;
}

// Copies `n` bytes of the WR's payload from `offset` into `dst`.
void Gather(const Wqe& w, uint64_t offset, uint64_t n, unsigned char* dst) {
  if (w.is_inline) {
    std::memcpy(dst, w.inline_data.data() + offset, n);
    return;
  }
  for (const ibv_sge& sge : w.sges) {
    if (n == 0) return;
    if (offset >= sge.length) {
      offset -= sge.length;
      continue;
    }
    const uint64_t take = std::min<uint64_t>(n, sge.length - offset);
    std::memcpy(dst, reinterpret_cast<const unsigned char*>(sge.addr) + offset, take);
    dst += take;
    n -= take;
    offset = 0;
  }
}

bool Nic::Requester(Qp& q) {
  kvrail::MutexLock lock(&q.mu);
  if (q.destroyed) return false;
  bool work = false;
  const absl::Time now = absl::Now();
  const bool up = RailUp(q.ctx->rail);

  // Acks, in order. A cut cable receives nothing, so they wait in the ring.
  if (up) {
    wire::Segment* s = q.seg;
    for (;;) {
      const uint64_t tail = s->ack_tail.load(std::memory_order_relaxed);
      if (tail == s->ack_head.load(std::memory_order_acquire)) break;
      const wire::Ack ack = s->acks[tail % wire::kAckSlots];
      s->ack_tail.store(tail + 1, std::memory_order_release);
      work = true;
      if (q.state != IBV_QPS_RTS || ack.epoch != q.epoch || q.epoch == 0) continue;
      q.last_progress = now;
      for (Wqe& w : q.sq) {
        if (w.seq > ack.msg_seq) break;
        if (w.acked || w.forced != IBV_WC_SUCCESS) continue;
        if (w.seq == ack.msg_seq && ack.status != IBV_WC_SUCCESS) {
          // A NAK, maybe while the rest of the write is still being sent: the write was refused
          // before any of it landed. Everything before it was acked (acks come in order).
          w.forced = static_cast<ibv_wc_status>(ack.status);
          break;
        }
        if (!w.tx_done) break;
        w.acked = true;
        Fault delay;
        if (TakeFault(FaultKind::kDelayCompletions, q.qpn, &delay)) w.ready_at = now + delay.delay;
      }
    }
  }
  if (q.state != IBV_QPS_RTS) return work;

  // Retire from the front, in order.
  while (!q.sq.empty()) {
    Wqe& w = q.sq.front();
    if (w.forced != IBV_WC_SUCCESS) {
      FailFront(q, w.forced);
      return true;
    }
    if (!w.acked || now < w.ready_at) break;
    Wqe done = std::move(w);
    q.sq.pop_front();
    if (q.next_tx > 0) --q.next_tx;
    Complete(q, done, IBV_WC_SUCCESS);
    work = true;
  }

  // Transmit.
  if (up && q.remote != nullptr) {
    wire::Segment* r = q.remote;
    while (q.next_tx < q.sq.size()) {
      Wqe& w = q.sq[q.next_tx];
      if (!w.started) {
        w.started = true;
        Fault fault;
        if (w.forced == IBV_WC_SUCCESS && TakeFault(FaultKind::kErrorCompletion, q.qpn, &fault)) {
          w.forced = fault.status;
        }
      }
      // A failing WR completes at the front; nothing after it is sent (the QP will be in ERR).
      if (w.forced != IBV_WC_SUCCESS) break;
      bool full = false;
      while (!w.tx_done) {
        const uint64_t head = r->req_head.load(std::memory_order_relaxed);
        if (head - r->req_tail.load(std::memory_order_acquire) >= wire::kSlots) {
          full = true;
          break;
        }
        const size_t slot = head % wire::kSlots;
        const uint64_t n = std::min<uint64_t>(wire::kSlotBytes, w.len - w.sent);
        wire::Packet& p = r->packets[slot];
        p.epoch = q.epoch;
        p.msg_seq = w.seq;
        p.raddr = w.raddr;
        p.total_len = w.len;
        p.offset = w.sent;
        p.len = n;
        p.rkey = w.rkey;
        p.src_qpn = q.qpn;
        Gather(w, w.sent, n, r->data[slot]);
        r->req_head.store(head + 1, std::memory_order_release);
        w.sent += n;
        w.tx_done = w.sent == w.len;
        q.last_progress = now;
        work = true;
      }
      if (full) break;
      ++q.next_tx;
    }
  }

  // Retry budget and dead peers: the oldest unacked WR fails with IBV_WC_RETRY_EXC_ERR.
  if (!q.sq.empty() && HasUnacked(q)) {
    bool fail = now - q.last_progress > q.budget;
    if (!fail && q.remote_pid != 0 && q.remote_pid != getpid() &&
        now - q.last_peer_check >= kPeerCheckEvery) {
      q.last_peer_check = now;
      fail = wire::ProcessIsDead(q.remote_pid);
    }
    if (fail) {
      // Acked WRs ahead of it (held by a delay) complete first, in order.
      while (!q.sq.empty() && q.sq.front().acked) {
        Wqe done = std::move(q.sq.front());
        q.sq.pop_front();
        if (q.next_tx > 0) --q.next_tx;
        Complete(q, done, IBV_WC_SUCCESS);
      }
      if (!q.sq.empty()) FailFront(q, IBV_WC_RETRY_EXC_ERR);
      work = true;
    }
  }
  return work;
}

enum class Landing { kLanded, kStale, kRefused };

bool Nic::Responder(Qp& q) {
  kvrail::MutexLock lock(&q.mu);
  if (q.destroyed) return false;
  // Before RTR a responder leaves requests in the ring, as a requester would retransmit them;
  // a cut cable receives nothing.
  if (q.state == IBV_QPS_RESET || q.state == IBV_QPS_INIT) return false;
  if (!RailUp(q.ctx->rail)) return false;
  wire::Segment* s = q.seg;
  bool work = false;
  for (size_t n = 0; n < wire::kSlots; ++n) {
    const uint64_t tail = s->req_tail.load(std::memory_order_relaxed);
    if (tail == s->req_head.load(std::memory_order_acquire)) break;
    const size_t slot = tail % wire::kSlots;
    const wire::Packet p = s->packets[slot];
    const bool live = (q.state == IBV_QPS_RTR || q.state == IBV_QPS_RTS) && q.remote != nullptr &&
                      p.src_qpn == q.dest_qpn;
    if (live && !(p.msg_seq == q.refused_seq && q.refused_seq != 0)) {
      wire::Segment* r = q.remote;
      const bool last = p.offset + p.len >= p.total_len;
      // Wait for room to answer rather than lose an ack.
      if (r->ack_head.load(std::memory_order_relaxed) -
              r->ack_tail.load(std::memory_order_acquire) >=
          wire::kAckSlots) {
        break;
      }
      Landing landing = Landing::kRefused;
      {
        kvrail::ReaderMutexLock mr_lock(&mr_mu);
        // Set busy before reading the epoch (seq_cst both): a requester that bumps the epoch
        // and then sees busy clear knows this copy will not happen (see Fence).
        s->busy.store(1, std::memory_order_seq_cst);
        if (s->inbound_epoch.load(std::memory_order_seq_cst) != p.epoch) {
          landing = Landing::kStale;
        } else if (p.total_len == 0) {
          landing = Landing::kLanded;
        } else {
          // The whole write's range is checked before any of it lands, on every packet, so a
          // dereg_mr between packets refuses the rest.
          auto it = mrs.find(p.rkey);
          const Mr* mr = it == mrs.end() ? nullptr : it->second;
          const uint64_t base = mr ? reinterpret_cast<uint64_t>(mr->ibv.addr) : 0;
          const bool ok = mr != nullptr && (mr->access & IBV_ACCESS_REMOTE_WRITE) &&
                          mr->pd == q.pd && p.raddr >= base && p.total_len <= mr->ibv.length &&
                          p.raddr - base <= mr->ibv.length - p.total_len &&
                          p.len <= wire::kSlotBytes && p.offset <= p.total_len &&
                          p.len <= p.total_len - p.offset;
          if (ok) {
            DmaWrite(reinterpret_cast<void*>(p.raddr + p.offset), s->data[slot], p.len);
            landing = Landing::kLanded;
          }
        }
        s->busy.store(0, std::memory_order_release);
      }
      if (landing != Landing::kStale && (last || landing == Landing::kRefused)) {
        const uint64_t head = r->ack_head.load(std::memory_order_relaxed);
        wire::Ack& ack = r->acks[head % wire::kAckSlots];
        ack.epoch = p.epoch;
        ack.msg_seq = p.msg_seq;
        ack.status = landing == Landing::kLanded ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR;
        ack.pad = 0;
        r->ack_head.store(head + 1, std::memory_order_release);
      }
      if (landing == Landing::kRefused) {
        // A remote access error moves the responder's QP to the error state too (IBTA 9.9.3).
        q.refused_seq = p.msg_seq;
        s->req_tail.store(tail + 1, std::memory_order_release);
        EnterError(q);
        return true;
      }
    }
    s->req_tail.store(tail + 1, std::memory_order_release);
    work = true;
  }
  return work;
}

void Nic::Run() {
  absl::Duration idle = absl::ZeroDuration();
  for (;;) {
    std::vector<std::shared_ptr<Qp>> snapshot;
    {
      kvrail::MutexLock lock(&mu);
      snapshot.reserve(qps.size());
      for (const auto& entry : qps) snapshot.push_back(entry.second);
    }
    bool work = false;
    for (const auto& q : snapshot) work |= Requester(*q);
    for (const auto& q : snapshot) work |= Responder(*q);
    const bool any = !snapshot.empty();
    snapshot.clear();
    if (work) {
      idle = absl::ZeroDuration();
      continue;
    }
    // Peers in other processes cannot wake us, so an idle NIC with QPs polls with a backoff up
    // to 1 ms; one without QPs sleeps until kicked.
    idle = std::clamp(idle * 2, absl::Microseconds(20), absl::Milliseconds(1));
    kvrail::MutexLock lock(&wake_mu);
    if (!kicked) wake_mu.WaitFor(wake_cv, any ? idle : absl::Milliseconds(100));
    if (kicked) idle = absl::ZeroDuration();
    kicked = false;
  }
}

void UnlinkAtExit() {
  Nic& nic = Nic::Get();
  kvrail::MutexLock lock(&nic.names_mu);
  for (const auto& [qpn, pid] : nic.names) {
    if (pid == getpid()) wire::UnlinkSegment(qpn);
  }
  nic.names.clear();
}

// ---- The table's functions ----

int SetErrno(int e) {
  errno = e;
  return e;
}

ibv_device** GetDeviceList(int* num_devices) {
  Nic& nic = Nic::Get();
  kvrail::MutexLock lock(&nic.mu);
  nic.LoadRailsLocked();
  auto** list = new ibv_device*[nic.rails.size() + 1];
  size_t i = 0;
  for (const Rail& rail : nic.rails) {
    Device*& d = nic.devices[rail.device];
    if (d == nullptr) {
      d = new Device;
      std::memset(&d->ibv, 0, sizeof(d->ibv));
      d->ibv.node_type = IBV_NODE_CA;
      d->ibv.transport_type = IBV_TRANSPORT_IB;
      std::snprintf(d->ibv.name, sizeof(d->ibv.name), "%s", rail.device.c_str());
      std::snprintf(d->ibv.dev_name, sizeof(d->ibv.dev_name), "softverbs-%s", rail.device.c_str());
    }
    d->rail = rail;
    list[i++] = &d->ibv;
  }
  list[i] = nullptr;
  if (num_devices != nullptr) *num_devices = static_cast<int>(i);
  return list;
}

void FreeDeviceList(ibv_device** list) { delete[] list; }

const char* GetDeviceName(ibv_device* device) { return device ? device->name : nullptr; }

ibv_context* OpenDevice(ibv_device* device) {
  if (device == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* ctx = new Context;
  std::memset(&ctx->ibv, 0, sizeof(ctx->ibv));
  ctx->ibv.device = device;
  ctx->ibv.cmd_fd = -1;
  ctx->ibv.async_fd = -1;
  ctx->ibv.num_comp_vectors = 1;
  {
    kvrail::MutexLock lock(&Nic::Get().mu);
    ctx->rail = ToDevice(device)->rail;
  }
  return &ctx->ibv;
}

int CloseDevice(ibv_context* context) {
  delete ToCtx(context);
  return 0;
}

int QueryDevice(ibv_context* context, ibv_device_attr* attr) {
  if (context == nullptr || attr == nullptr) return SetErrno(EINVAL);
  std::memset(attr, 0, sizeof(*attr));
  std::snprintf(attr->fw_ver, sizeof(attr->fw_ver), "softverbs");
  const ibv_gid gid = rails::LinkLocalGid(ToCtx(context)->rail);
  std::memcpy(&attr->node_guid, &gid.raw[8], 8);
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = 1ULL << 46;
  attr->page_size_cap = 4096;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = kMaxQpWr;
  attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
  attr->max_sge = kMaxSge;
  attr->max_cq = 1 << 16;
  attr->max_cqe = kMaxCqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->phys_port_cnt = 1;
  return 0;
}

int QueryPort(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) {
  if (context == nullptr || attr == nullptr || port_num != 1) return SetErrno(EINVAL);
  const Rail& rail = ToCtx(context)->rail;
  std::memset(attr, 0, sizeof(*attr));
  const bool up = Nic::Get().RailUp(rail);
  attr->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->phys_state = up ? 5 /* LinkUp */ : 3 /* Disabled */;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = 2;
  attr->max_msg_sz = 1U << 31;
  attr->pkey_tbl_len = 1;
  attr->lid = 0;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  rails::SpeedFor(rail.gbps, &attr->active_width, &attr->active_speed);
  return 0;
}

int QueryGidEx(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
               uint32_t flags) {
  if (context == nullptr || entry == nullptr || port_num != 1 || flags != 0) {
    return SetErrno(EINVAL);
  }
  const Rail& rail = ToCtx(context)->rail;
  std::optional<ibv_gid> gid;
  if (gid_index == 0) gid = rails::LinkLocalGid(rail);
  if (gid_index == 1) gid = rails::Ipv4Gid(rail);
  if (!gid) return SetErrno(ENODATA);
  std::memset(entry, 0, sizeof(*entry));
  entry->gid = *gid;
  entry->gid_index = gid_index;
  entry->port_num = port_num;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  entry->ndev_ifindex = if_nametoindex(rail.netdev.c_str());
  return 0;
}

ibv_pd* AllocPd(ibv_context* context) {
  if (context == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* pd = new Pd;
  std::memset(&pd->ibv, 0, sizeof(pd->ibv));
  pd->ibv.context = context;
  static std::atomic<uint32_t> handles{1};
  pd->ibv.handle = handles.fetch_add(1);
  return &pd->ibv;
}

int DeallocPd(ibv_pd* ibv) {
  Pd* pd = ToPd(ibv);
  {
    kvrail::MutexLock lock(&Nic::Get().mu);
    if (pd->users != 0) return SetErrno(EBUSY);
  }
  delete pd;
  return 0;
}

ibv_mr* RegMr(ibv_pd* ibv_pd, void* addr, size_t length, int access) {
  if (ibv_pd == nullptr || addr == nullptr || length == 0) {
    errno = EINVAL;
    return nullptr;
  }
  // As in the verbs spec, remote write needs local write.
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  Nic& nic = Nic::Get();
  Pd* pd = ToPd(ibv_pd);
  auto* mr = new Mr;
  std::memset(&mr->ibv, 0, sizeof(mr->ibv));
  mr->ibv.context = ibv_pd->context;
  mr->ibv.pd = ibv_pd;
  mr->ibv.addr = addr;
  mr->ibv.length = length;
  mr->access = access;
  mr->pd = pd;
  {
    kvrail::WriterMutexLock lock(&nic.mr_mu);
    // Keys advance through the 32-bit space from a per-process start, so a key is not reused
    // soon and keys of different processes rarely meet; 0 is never a key.
    if (nic.next_key == 0) nic.next_key = (static_cast<uint32_t>(getpid()) * 2654435761u) | 1;
    do {
      nic.next_key += 0x101;
    } while (nic.next_key == 0 || nic.mrs.count(nic.next_key));
    mr->ibv.lkey = mr->ibv.rkey = nic.next_key;
    mr->ibv.handle = nic.next_key;
    nic.mrs[nic.next_key] = mr;
  }
  kvrail::MutexLock lock(&nic.mu);
  ++pd->users;
  return &mr->ibv;
}

int DeregMr(ibv_mr* ibv) {
  if (ibv == nullptr) return SetErrno(EINVAL);
  Nic& nic = Nic::Get();
  Mr* mr = ToMr(ibv);
  {
    // Exclusive: waits for a responder copy into this region to finish; later packets with
    // this rkey find no MR and are refused.
    kvrail::WriterMutexLock lock(&nic.mr_mu);
    nic.mrs.erase(ibv->lkey);
  }
  {
    kvrail::MutexLock lock(&nic.mu);
    --mr->pd->users;
  }
  delete mr;
  return 0;
}

ibv_comp_channel* CreateCompChannel(ibv_context* context) {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* ch = new Channel;
  std::memset(&ch->ibv, 0, sizeof(ch->ibv));
  ch->ibv.context = context;
  ch->ibv.fd = fd;
  return &ch->ibv;
}

int DestroyCompChannel(ibv_comp_channel* ibv) {
  Channel* ch = ToChannel(ibv);
  {
    kvrail::MutexLock lock(&Nic::Get().mu);
    if (ch->users != 0) return SetErrno(EBUSY);
  }
  close(ch->ibv.fd);
  delete ch;
  return 0;
}

ibv_cq* CreateCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                 int comp_vector) {
  if (context == nullptr || cqe < 1 || cqe > kMaxCqe || comp_vector != 0) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new Cq;
  std::memset(&cq->ibv, 0, sizeof(cq->ibv));
  cq->ibv.context = context;
  cq->ibv.channel = channel;
  cq->ibv.cq_context = cq_context;
  cq->ibv.cqe = cqe;
  cq->channel = ToChannel(channel);
  if (channel != nullptr) {
    kvrail::MutexLock lock(&Nic::Get().mu);
    ++cq->channel->users;
  }
  return &cq->ibv;
}

int DestroyCq(ibv_cq* ibv) {
  Cq* cq = ToCq(ibv);
  {
    kvrail::MutexLock lock(&Nic::Get().mu);
    if (cq->users != 0) return SetErrno(EBUSY);
    if (cq->channel != nullptr) --cq->channel->users;
  }
  if (cq->channel != nullptr) {
    // Unread events of this CQ go with it (libibverbs would wait for them to be acked).
    kvrail::MutexLock lock(&cq->channel->mu);
    auto& events = cq->channel->events;
    events.erase(std::remove(events.begin(), events.end(), cq), events.end());
  }
  delete cq;
  return 0;
}

int ReqNotifyCq(ibv_cq* ibv, int solicited_only) {
  Cq* cq = ToCq(ibv);
  kvrail::MutexLock lock(&cq->mu);
  // As on hardware, only completions added after arming raise an event.
  cq->armed = true;
  return 0;
}

int GetCqEvent(ibv_comp_channel* ibv, ibv_cq** cq, void** cq_context) {
  Channel* ch = ToChannel(ibv);
  uint64_t value = 0;
  if (read(ch->ibv.fd, &value, sizeof(value)) != sizeof(value)) return -1;  // errno: EAGAIN.
  kvrail::MutexLock lock(&ch->mu);
  if (ch->events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  Cq* c = ch->events.front();
  ch->events.pop_front();
  *cq = &c->ibv;
  *cq_context = c->ibv.cq_context;
  return 0;
}

void AckCqEvents(ibv_cq* ibv, unsigned int nevents) {
  Cq* cq = ToCq(ibv);
  kvrail::MutexLock lock(&cq->mu);
  cq->ibv.comp_events_completed += nevents;
}

int PollCq(ibv_cq* ibv, int num_entries, ibv_wc* wc) {
  Cq* cq = ToCq(ibv);
  kvrail::MutexLock lock(&cq->mu);
  if (cq->overrun) return -1;
  int n = 0;
  while (n < num_entries && !cq->wcs.empty()) {
    wc[n++] = cq->wcs.front();
    cq->wcs.pop_front();
  }
  return n;
}

ibv_qp* CreateQp(ibv_pd* ibv_pd, ibv_qp_init_attr* attr) {
  if (ibv_pd == nullptr || attr == nullptr || attr->send_cq == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->qp_type != IBV_QPT_RC) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (attr->srq != nullptr || attr->cap.max_send_wr == 0 || attr->cap.max_send_wr > kMaxQpWr ||
      attr->cap.max_send_sge > kMaxSge || attr->cap.max_inline_data > kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  Nic& nic = Nic::Get();
  auto q = std::make_shared<Qp>();
  q->seg = wire::CreateSegment(&q->qpn);
  if (q->seg == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  Context* ctx = ToCtx(ibv_pd->context);
  q->ctx = ctx;
  q->pd = ToPd(ibv_pd);
  q->cq = ToCq(attr->send_cq);
  q->max_send_wr = attr->cap.max_send_wr;
  q->max_sge = std::max<uint32_t>(1, attr->cap.max_send_sge);
  q->max_inline = attr->cap.max_inline_data;
  q->sig_all = attr->sq_sig_all != 0;
  attr->cap.max_send_sge = q->max_sge;
  std::memset(&q->ibv, 0, sizeof(q->ibv));
  q->ibv.context = ibv_pd->context;
  q->ibv.qp_context = attr->qp_context;
  q->ibv.pd = ibv_pd;
  q->ibv.send_cq = attr->send_cq;
  q->ibv.recv_cq = attr->recv_cq;
  q->ibv.qp_num = q->qpn;
  q->ibv.handle = q->qpn;
  q->ibv.state = IBV_QPS_RESET;
  q->ibv.qp_type = IBV_QPT_RC;
  // The segment advertises the rail's GIDs so a peer can check that its dgid routes here.
  const ibv_gid gid0 = rails::LinkLocalGid(ctx->rail);
  const std::optional<ibv_gid> gid1 = rails::Ipv4Gid(ctx->rail);
  uint64_t words[2][2] = {};
  std::memcpy(words[0], gid0.raw, 16);
  if (gid1) std::memcpy(words[1], gid1->raw, 16);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) q->seg->gid[i][j].store(words[i][j], std::memory_order_relaxed);
  }
  q->seg->magic.store(wire::kMagic, std::memory_order_release);
  {
    kvrail::MutexLock lock(&nic.names_mu);
    static const bool registered = [] { return std::atexit(UnlinkAtExit) == 0; }();
    (void)registered;
    nic.names[q->qpn] = getpid();
  }
  ibv_qp* result = &q->ibv;
  kvrail::MutexLock lock(&nic.mu);
  ++q->pd->users;
  ++q->cq->users;
  nic.qps[q->qpn] = std::move(q);
  nic.StartThreadLocked();
  return result;
}

int DestroyQp(ibv_qp* ibv) {
  if (ibv == nullptr) return SetErrno(EINVAL);
  Nic& nic = Nic::Get();
  std::shared_ptr<Qp> q;
  {
    kvrail::MutexLock lock(&nic.mu);
    auto it = nic.qps.find(ibv->qp_num);
    if (it == nic.qps.end()) return SetErrno(EINVAL);
    q = std::move(it->second);
    nic.qps.erase(it);
    --q->pd->users;
    --q->cq->users;
  }
  {
    kvrail::MutexLock lock(&q->mu);
    Disconnect(*q);
    q->destroyed = true;
    q->sq.clear();  // As ibv_destroy_qp: outstanding WRs go without completions.
    SetState(*q, IBV_QPS_RESET);
  }
  wire::UnlinkSegment(q->qpn);
  {
    kvrail::MutexLock lock(&nic.names_mu);
    nic.names.erase(q->qpn);
  }
  return 0;  // The NIC thread may hold the last reference; the segment is unmapped with it.
}

bool GidMatches(const wire::Segment* s, const ibv_gid& gid) {
  uint64_t words[2];
  std::memcpy(words, gid.raw, 16);
  for (int i = 0; i < 2; ++i) {
    if ((words[0] | words[1]) != 0 && s->gid[i][0].load(std::memory_order_relaxed) == words[0] &&
        s->gid[i][1].load(std::memory_order_relaxed) == words[1]) {
      return true;
    }
  }
  return false;
}

absl::Duration RetryBudget(uint8_t timeout, uint8_t retry_cnt) {
  if (timeout == 0) return absl::InfiniteDuration();  // IBTA: 0 means no timeout.
  const absl::Duration one = absl::Nanoseconds(4096) * (1LL << std::min<int>(timeout, 31));
  return std::max(kMinRetryBudget, one * (std::min<int>(retry_cnt, 7) + 1));
}

int ModifyQp(ibv_qp* ibv, ibv_qp_attr* attr, int mask) {
  if (ibv == nullptr || attr == nullptr || !(mask & IBV_QP_STATE)) return SetErrno(EINVAL);
  Qp& q = *ToQp(ibv);
  kvrail::MutexLock lock(&q.mu);
  if (q.destroyed) return SetErrno(EINVAL);
  const ibv_qp_state cur = q.state;
  const ibv_qp_state next = attr->qp_state;
  if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return SetErrno(EINVAL);
  auto has = [mask](int bits) { return (mask & bits) == bits; };
  switch (next) {
    case IBV_QPS_RESET:
      // To RESET: fenced like ERR; outstanding WRs are dropped without completions.
      Disconnect(q);
      q.sq.clear();
      q.next_tx = 0;
      q.sq_used = 0;
      q.unsignaled_done = 0;
      q.refused_seq = 0;
      SetState(q, IBV_QPS_RESET);
      return 0;
    case IBV_QPS_ERR:
      EnterError(q);
      return 0;
    case IBV_QPS_INIT:
      if (cur == IBV_QPS_RESET) {
        if (!has(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return SetErrno(EINVAL);
      } else if (cur != IBV_QPS_INIT) {
        return SetErrno(EINVAL);
      }
      if ((mask & IBV_QP_PORT) && attr->port_num != 1) return SetErrno(EINVAL);
      if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) return SetErrno(EINVAL);
      SetState(q, IBV_QPS_INIT);
      return 0;
    case IBV_QPS_RTR: {
      if (cur != IBV_QPS_INIT) return SetErrno(EINVAL);
      if (!has(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        return SetErrno(EINVAL);
      }
      // RoCE addresses by GID: the AV needs a GRH with a valid source GID index.
      const ibv_ah_attr& ah = attr->ah_attr;
      if (!ah.is_global || ah.grh.sgid_index > 1 || (ah.port_num != 0 && ah.port_num != 1)) {
        return SetErrno(EINVAL);
      }
      if (ah.grh.sgid_index == 1 && !rails::Ipv4Gid(q.ctx->rail)) return SetErrno(EINVAL);
      if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096) return SetErrno(EINVAL);
      if (attr->dest_qp_num == 0 || attr->dest_qp_num > 0xFFFFFF) return SetErrno(EINVAL);
      q.dest_qpn = attr->dest_qp_num;
      q.refused_seq = 0;
      // As on a real fabric, an unknown or misrouted destination is not an error here: the
      // requests simply never get an answer and time out.
      wire::Segment* r = wire::MapSegment(attr->dest_qp_num);
      if (r != nullptr && !GidMatches(r, ah.grh.dgid)) {
        wire::UnmapSegment(r);
        r = nullptr;
      }
      q.remote = r;
      if (r != nullptr) {
        q.epoch = r->inbound_epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
        q.remote_pid = wire::OwnerPid(r);  // 0 (unknown) in another PID namespace.
      }
      SetState(q, IBV_QPS_RTR);
      return 0;
    }
    case IBV_QPS_RTS:
      if (cur == IBV_QPS_RTR) {
        if (!has(IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                 IBV_QP_MAX_QP_RD_ATOMIC)) {
          return SetErrno(EINVAL);
        }
        if (attr->retry_cnt > 7 || attr->timeout > 31) return SetErrno(EINVAL);
        q.budget = RetryBudget(attr->timeout, attr->retry_cnt);
      } else if (cur != IBV_QPS_RTS) {
        return SetErrno(EINVAL);
      }
      q.last_progress = absl::Now();
      SetState(q, IBV_QPS_RTS);
      return 0;
    default:
      return SetErrno(EINVAL);  // SQD and SQE are not modelled.
  }
}

int PostSend(ibv_qp* ibv, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Qp& q = *ToQp(ibv);
  Nic& nic = Nic::Get();
  int rc = 0;
  {
    kvrail::MutexLock lock(&q.mu);
    const absl::Time now = absl::Now();
    for (; wr != nullptr; wr = wr->next) {
      const bool is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
      if (q.destroyed || wr->opcode != IBV_WR_RDMA_WRITE || wr->num_sge < 0 ||
          static_cast<uint32_t>(wr->num_sge) > q.max_sge ||
          (wr->num_sge > 0 && wr->sg_list == nullptr)) {
        rc = EINVAL;
        break;
      }
      if (q.state != IBV_QPS_RTS && q.state != IBV_QPS_ERR) {
        rc = EINVAL;
        break;
      }
      if (q.state == IBV_QPS_RTS && q.sq_used >= q.max_send_wr) {
        rc = ENOMEM;  // The send queue is full.
        break;
      }
      Wqe w;
      w.wr_id = wr->wr_id;
      w.signaled = q.sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
      w.raddr = wr->wr.rdma.remote_addr;
      w.rkey = wr->wr.rdma.rkey;
      w.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
      for (const ibv_sge& sge : w.sges) w.len += sge.length;
      if (w.len > (1ULL << 31)) w.forced = IBV_WC_LOC_LEN_ERR;
      if (is_inline) {
        if (w.len > q.max_inline) {
          rc = EINVAL;
          break;
        }
        // Inline data is copied at post time and needs no lkey.
        w.is_inline = true;
        w.inline_data.resize(w.len);
        Gather(w, 0, w.len, w.inline_data.data());
        w.is_inline = true;
      }
      if (q.state == IBV_QPS_ERR) {
        Complete(q, w, IBV_WC_WR_FLUSH_ERR);
        continue;
      }
      if (!is_inline && w.forced == IBV_WC_SUCCESS) {
        kvrail::ReaderMutexLock mr_lock(&nic.mr_mu);
        for (const ibv_sge& sge : w.sges) {
          if (sge.length == 0) continue;
          auto it = nic.mrs.find(sge.lkey);
          const Mr* mr = it == nic.mrs.end() ? nullptr : it->second;
          const uint64_t base = mr ? reinterpret_cast<uint64_t>(mr->ibv.addr) : 0;
          if (mr == nullptr || mr->pd != q.pd || sge.addr < base || sge.length > mr->ibv.length ||
              sge.addr - base > mr->ibv.length - sge.length) {
            w.forced = IBV_WC_LOC_PROT_ERR;
            break;
          }
        }
      }
      if (!HasUnacked(q)) q.last_progress = now;
      w.seq = ++q.next_seq;
      q.sq.push_back(std::move(w));
      ++q.sq_used;
    }
  }
  if (rc != 0) {
    if (bad_wr != nullptr) *bad_wr = wr;
    errno = rc;
  }
  nic.Kick();
  return rc;
}

VerbsApi MakeApi() {
  VerbsApi api;
  api.provider = "softverbs";
  api.get_device_list = GetDeviceList;
  api.free_device_list = FreeDeviceList;
  api.get_device_name = GetDeviceName;
  api.open_device = OpenDevice;
  api.close_device = CloseDevice;
  api.query_device = QueryDevice;
  api.query_port = QueryPort;
  api.query_gid_ex = QueryGidEx;
  api.alloc_pd = AllocPd;
  api.dealloc_pd = DeallocPd;
  api.reg_mr = RegMr;
  api.reg_dmabuf_mr = nullptr;
  api.dereg_mr = DeregMr;
  api.create_comp_channel = CreateCompChannel;
  api.destroy_comp_channel = DestroyCompChannel;
  api.create_cq = CreateCq;
  api.destroy_cq = DestroyCq;
  api.req_notify_cq = ReqNotifyCq;
  api.get_cq_event = GetCqEvent;
  api.ack_cq_events = AckCqEvents;
  api.poll_cq = PollCq;
  api.create_qp = CreateQp;
  api.modify_qp = ModifyQp;
  api.destroy_qp = DestroyQp;
  api.post_send = PostSend;
  return api;
}

}  // namespace

const VerbsApi& SoftVerbsApi() {
  static const VerbsApi api = MakeApi();
  return api;
}

void SetRails(std::vector<Rail> rails) {
  Nic& nic = Nic::Get();
  kvrail::MutexLock lock(&nic.mu);
  nic.rails = std::move(rails);
  nic.rails_loaded = true;
}

void InjectFault(const Fault& fault) {
  Nic& nic = Nic::Get();
  switch (fault.kind) {
    case FaultKind::kRailDown: {
      kvrail::MutexLock lock(&nic.fault_mu);
      if (fault.down) {
        nic.down.insert(fault.device);
      } else {
        nic.down.erase(fault.device);
      }
      break;
    }
    case FaultKind::kQpError: {
      std::vector<std::shared_ptr<Qp>> hit;
      {
        kvrail::MutexLock lock(&nic.mu);
        for (const auto& entry : nic.qps) {
          if (fault.qp_num == 0 || entry.first == fault.qp_num) hit.push_back(entry.second);
        }
      }
      for (const auto& q : hit) {
        kvrail::MutexLock lock(&q->mu);
        if (!q->destroyed) EnterError(*q);
      }
      break;
    }
    case FaultKind::kErrorCompletion:
    case FaultKind::kDelayCompletions: {
      kvrail::MutexLock lock(&nic.fault_mu);
      nic.faults.push_back(fault);
      break;
    }
  }
  nic.Kick();
}

void ClearFaults() {
  Nic& nic = Nic::Get();
  {
    kvrail::MutexLock lock(&nic.fault_mu);
    nic.faults.clear();
    nic.down.clear();
  }
  nic.Kick();
}

std::string SegmentName(uint32_t qp_num) { return "/dev/shm" + wire::ShmName(qp_num); }

}  // namespace kvrail::transport::softverbs
