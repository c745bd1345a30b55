// The UCX backend (engine/transport/transport.h): one ucp_context per transport, one ucp_worker
// per lane. Over shared memory only (tls "sm,self") a write is ucp_put_nbx and a Flush is
// ucp_ep_flush_nbx. Wherever tcp may carry the bytes (tls naming tcp, or UCX's default), a write
// is a train of active messages and a Flush is a round trip through the peer (see "Writes over
// tcp" below).
//
// Threading: each lane is a UCX worker (UCS_THREAD_MODE_SERIALIZED) owned by one thread, fed by
// a queue. Once Create has started the lane's thread, that thread alone calls into its worker:
// ucp_put_nbx, ucp_am_send_nbx, ucp_ep_flush_nbx, ucp_ep_create, ucp_ep_rkey_unpack,
// ucp_ep_close_nbx, ucp_worker_progress, request frees, rkey destroys, and at Close
// ucp_worker_destroy; UCX's callbacks (request completions, endpoint errors, active messages)
// run inside those calls on that thread, and everything a lane keeps of a peer (endpoint, rkeys,
// undelivered operations, the active-message counters) is that thread's alone. PostWrites and
// Flush check what they can at once (lane, peer, source region, bounds: the errors of
// transport.h), then push a job (the batch's checked writes and source, or the flush) onto the
// lane's queue and wake its thread; they never touch UCX. The thread takes every queued job in
// one go, stores in one pass the slices that batches of several peers read of the same source
// rows over shared memory (ucx_puts.h, StoreSharedRows: decision 0020; a batch a round ahead of
// another peer's may wait one round, never past a job of its own peer), issues the jobs in queue
// order (so a lane's flush follows the batches before it), polls the worker, and then delivers
// the completions that finished with no lock held. Over shared
// memory a put is a copy by the thread that issues it, so lanes still copy on different cores
// at once; a completion that posts on its own lane queues the next job for its own thread.
//
// Locks, in the order they are taken: the transport's mutex (mu_); every lane's worker mutex,
// in lane order; every lane's queue mutex, in lane order. A lane's queue mutex guards only its
// queue and its spare ops, and is held for a push or a take, never across a UCX call or a wait.
// A lane's worker mutex is held by its thread while it issues jobs and polls the worker, never
// while it delivers completions or sleeps; no post, flush or Connect takes it. Transport-wide
// state (regions, peers, closed) is written holding mu_ and every lane's mutexes of both kinds,
// and read holding any one: a post reads it holding its lane's queue mutex, a lane's thread
// (the regions, in UCX's active-message callback and before it sends a batch) holding its
// worker mutex. So Register, Deregister and Disconnect wait at most for each lane's current
// round of UCX calls, never for a completion or for a peer: when Deregister returns no lane is
// copying into or sending from the region, and the jobs still queued with it as their source
// are cancelled, not sent. The calls a completion may make (transport.h), running on a lane's
// thread, only queue jobs or take these mutexes, which that thread is not holding then: none
// deadlocks. (Connect is not one of them: on a lane's thread it would wait for that lane's
// wireup, which only that thread progresses, until its timeout.) Register and Deregister call
// ucp_mem_map and ucp_mem_unmap (the context's, not a worker's) under mu_.
//
// Connect holds no lock while it waits: it queues a connect job on every lane (holding mu_ and
// one lane's queue mutex at a time), and each lane's thread creates the peer's endpoint on its
// worker, unpacks the peer's rkeys and starts UCX's wireup there (a flush of the new endpoint,
// which the thread then progresses). Connect waits for every lane's wireup, up to
// UcxOptions::connect_timeout, holding nothing; only then does it publish the peer, under mu_
// and every lane's mutexes, for a moment. So one peer that never answers (stopped,
// unreachable) costs its own Connect, never another peer's posts, flushes or Connect. The
// peer's id is taken when the jobs are queued: a failed Connect leaves its id unused.
//
// UCX 1.13 emulates puts into user memory over active messages (docs MACHINE-NOTES), so the
// TARGET transport's progress threads must run for a write to land: they always do while the
// transport is open. Memory from Allocate over shared memory is written with plain stores.
//
// Writes over tcp. UCX 1.13 answers every emulated put with an acknowledgement sent from inside
// its put handler (ucp_put_handler -> ucp_rma_sw_send_cmpl), and treats any error from that send
// as fatal (ucp_request.inl: "Fatal: unexpected error: Endpoint timeout"). When a writer process
// dies while its puts are still queued in the target's socket, the target reads them, its
// acknowledgement finds the connection reset, and the TARGET process aborts: no setting of UCX
// avoids that. So over tcp this backend never uses UCX's puts: a write is sent as eager active
// messages of at most one tcp segment, each naming its destination, which the target's lane
// thread checks against the regions it has registered and copies in (a write outside them is
// refused, and the next Flush says so); consecutive small writes of a batch (up to 1/8 of a
// segment each) share one message, a table of their destinations and lengths then their bytes,
// which the target checks and copies one by one; a Flush sends the number of messages the lane
// sent and completes when the target answers that it has handled that many. The target sends
// nothing but those answers, and a failed answer is only a failed request: a writer that dies
// mid-room costs the target nothing. A writer with a name (UcxOptions::writer_name) sends it
// first on every connection (kHelloAm); RefuseWriter(name) then makes each lane, between two of
// its rounds, refuse every later write of the connections of that name made so far, so that what
// a writer found gone had handed to the kernel lands nowhere (decision 0021). Shared memory keeps
// UCX's puts: an acknowledgement goes into the writer's receive FIFO, which stays mapped in the
// target when the writer dies, so sending one never fails (at worst it waits for room).
//
// Peer failure: endpoints ask UCX for peer-failure handling (UCP_ERR_HANDLING_MODE_PEER) on tcp
// and on shared memory (UCX 1.13 offers it there only with UCX_MM_ERROR_HANDLING=y in the
// environment, which the first transport of a process sets unless the operator chose it). A peer
// whose process died fails its endpoints at once over tcp (its kernel resets the connection) and
// within about UcxOptions::keepalive_interval over shared memory (UCX's keepalive finds its
// process gone; a zombie that its parent has not reaped still counts as alive). Then its batches
// and flushes fail with kUnavailable. Over shared memory that second is too late: a peer's
// segment stays mapped here when it dies, so the stores into it and UCX's flush of them succeed,
// and a transfer to a decode that had just died reported Success. So every descriptor names
// its owner process (SelfProcess), each peer certainly on this host (reached over shared memory
// alone, or with a region UCX maps here: WatchOwner; a boot id could be a cloned VM's) is watched
// through a pidfd (PeerState::owner, engine/transport/peer_process.h), and a Flush over puts or
// stores completes OK only if the owner was seen alive at most 50 us before (OwnerGone; a
// Connect to an owner already gone fails too). A peer that is alive but stopped fails nothing:
// only the caller's deadlines end its rooms.
//
// Fencing, for this backend (what the generic contract in transport.h leaves to each one):
//   * A Flush of (peer, lane) that completed OK means every write posted there before it has
//     been copied into the peer's memory: over tcp the peer answered after copying every one of
//     them; over shared memory UCX's flush saw every put acknowledged (or, into memory from the
//     peer's Allocate, stored). A failed Flush says nothing about which of them landed.
//   * Disconnect (and Close) deliver the peer's outstanding completions as kCancelled and close
//     its endpoints with UCP_EP_CLOSE_FLAG_FORCE (a flushing close where an endpoint fell back to
//     no error handling): writes still queued inside UCX are dropped and nothing more leaves this
//     process for that peer. Disconnect marks the peer closed holding every lane's worker mutex
//     and queues a close job on every lane; it does not wait for the lanes' threads (which may
//     be running completions). From then on a lane's thread sends nothing for the peer: its
//     batches and flushes still queued are cancelled, not sent, and its close job, queued behind
//     them, force-closes the endpoint before the thread polls its worker again. Writes UCX already
//     handed over (to the kernel's socket buffers over tcp, into the peer's receive FIFO over
//     shared memory) may still be copied by the peer after Disconnect returns; only a completed
//     Flush, or the peer's death, says that none will.
//   * Close does fence where the peer answers. Over tcp each lane's close job at the transport's
//     Close sends the peer a last flush (SendCloseFence, after cancelling the peer's queued
//     work) and its TearDown closes the endpoint once the target answered it, so every message
//     the socket took has been copied or refused by then; a target that does not answer within
//     Lane::kCloseFenceWait (2 s: stopped, or gone without the endpoint failing) is not waited
//     for longer, and then only its death says that nothing more lands. Before this, a write
//     still in the sockets landed after Close returned in about 1 run in 12 of the conformance
//     suite's NoWriteLandsAfterCloseReturns over tcp. Over shared memory the lanes' stores into a
//     peer's Allocate are done before Close returns; puts into memory the peer registered go
//     through its receive FIFO, and the force close does not wait for them.
//
// Known limits (UCX, not this code):
//   * Over shared memory a write into a region the peer has deregistered is not detected: UCX's
//     software put handler at the target copies to the address without checking it against a
//     registration (over tcp the target refuses it, and the next Flush fails).
//   * Over shared memory into memory the target registered (not its Allocate), UCX emulates puts
//     through the target lane's receive FIFO, whose slots a writer claims and then fills
//     (uct_mm_ep_am_common_send): a writer killed between the two leaves a slot never filled, and
//     that target lane receives nothing more from anyone, though its process lives on. Memory from
//     Allocate is written with plain stores and is not exposed to this.
//   * Over shared memory in one process a closed peer is never reported dead (UCX's keepalive
//     checks the peer's pid, which is alive). See ucx_conformance_test and its BUILD target.
//
// Files, one seam each (all in namespace ucx_internal but this facade and the protocol):
//   ucx_options.h   what a transport is made with; UCX's tuning environment for ucx_perftest
//   ucx_context.*   options checked, UCX's configuration, ucp_init, writes over puts or messages
//   ucx_lane.*      a lane: worker, thread, job queue, operations, completions (RunLane, Issue)
//   ucx_endpoint.*  a peer and its endpoint per lane: the connect and close jobs, the wireup
//   ucx_memory.*    registration (ucp_mem_map, rkeys) and Allocate's "ucx-shm" segment
//   ucx_puts.*      writes over shared memory: stores into a peer's mapped segment, else puts
//   ucx_am.*        kvrail's active-message protocol over UCX, both ends (handlers, sends)
//   am_protocol.*   that protocol as pure code: layouts, batch to messages, both state machines
//   ucx_transport.* the Transport facade that wires these together
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/memory/arena.h"
#include "engine/transport/transport.h"
#include "engine/transport/ucx/ucx_options.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

namespace ucx_internal {
struct Lane;
struct PeerState;
struct Shared;
}  // namespace ucx_internal

class UcxTransport final : public Transport {
 public:
  // InvalidArgument for lanes < 1, max_write_bytes == 0, a negative keepalive interval or a
  // connect timeout that is not positive; Unavailable (with UCX's status string) when UCX cannot
  // create the context or a worker. Starts the lanes' progress threads.
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxOptions& options);

  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  const Capabilities& capabilities() const override { return capabilities_; }
  // The lanes' sleeps, by what ended them (summed over the lanes).
  TransportCounters transport_counters() const override;
  absl::StatusOr<size_t> RefuseWriter(std::string_view writer) override;
  absl::StatusOr<RegionId> Register(const LocalRegion& region) override;
  // UCX's own shared-memory segment ("ucx-shm": UCX_ALLOC_PRIO puts UCX's posix segments
  // first) when a shared-memory transport is loaded, so that UCX peers on this host store into
  // it directly; UCX 1.13 emulates puts into any other memory over active messages. Otherwise
  // (tcp only, or /dev/shm full) the memfd placement.
  absl::StatusOr<SharedRegion> Allocate(uint64_t length) override;
  absl::Status Deregister(RegionId region) override;
  absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const override;
  // Waits up to UcxOptions::connect_timeout for UCX's wireup on every lane, holding no lock that
  // other calls need (see above). DeadlineExceeded when the peer did not answer in time,
  // Unavailable when its endpoints failed, both naming it by its descriptor's session id;
  // FailedPrecondition when the transport is closed, before or during the wait.
  absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& peer) override;
  absl::Status PostWrites(PeerId peer, int lane, RegionId source, absl::Span<const Write> writes,
                          Completion done) override;
  absl::Status Flush(PeerId peer, int lane, Completion done) override;
  absl::Status Disconnect(PeerId peer) override;
  void Close() override;

 private:
  UcxTransport(const UcxOptions& options);
  absl::Status Init(const UcxOptions& options);

  bool OnLaneThread() const;
  // After every lane's thread has ended: unmaps the regions (and destroys a worker whose
  // thread never started).
  void ReleaseAll();
  // mu_ and every lane's mutexes held: marks `peer` closed and queues a close job on every
  // lane. Once per peer; later calls do nothing.
  void ClosePeer(const std::shared_ptr<ucx_internal::PeerState>& peer, const char* why);

  // What a post and a flush start with: `done` is set, the lane exists, its queue mutex is held
  // (`lock`) and `peer` is connected. Errors carry context().
  struct Started {
    std::unique_lock<std::mutex> lock;
    ucx_internal::Lane* home;
    ucx_internal::PeerState* state;
  };
  absl::StatusOr<Started> Start(PeerId peer, int lane, const Completion& done,
                                absl::FunctionRef<std::string()> context);
  // At the end of Connect, its wireup done: watches the peer's owner process (PeerState::owner)
  // where the peer is certainly on this host. Unavailable when that process has exited.
  absl::Status WatchOwner(ucx_internal::PeerState& state, const v1::ProcessIdentity& owner) const;
  // mu_ or any lane's queue mutex held: the connected peer, or why not.
  absl::StatusOr<ucx_internal::PeerState*> FindPeerLocked(PeerId peer, int lane) const;

  Capabilities capabilities_;
  const v1::ProcessIdentity self_;  // this process, for the descriptor's owner

  void* context_ = nullptr;  // ucp_context_h, destroyed by the destructor
  // One per lane, fixed once Init returns; each guards itself (see ucx_internal::Lane and
  // "Threading" above).
  std::vector<std::unique_ptr<ucx_internal::Lane>> lanes_;
  std::vector<std::thread::id> lane_threads_;  // written by Create before anyone can call back

  mutable std::mutex mu_;
  // Written with mu_ and every lane's mutexes held; read with any of them (a post holds only its
  // lane's queue mutex, a lane's thread its worker mutex). allocated_ and next_peer_ are mu_'s
  // alone.
  bool closed_ = false;    // Close was called: no new work
  bool released_ = false;  // ReleaseAll ran: regions unmapped, workers destroyed
  PeerId next_peer_ = 1;
  // What the lanes read of the transport (ucx_lane.h): the registrations and the descriptor
  // version, written as the fields above, and the fixed choice of puts or active messages.
  std::unique_ptr<ucx_internal::Shared> shared_;
  std::map<RegionId, std::unique_ptr<Arena>> allocated_;  // Allocate's memfd placements
  std::map<PeerId, std::shared_ptr<ucx_internal::PeerState>> peers_;
  // mu_'s alone: peers whose Connect is waiting for wireup, so that Close can end them.
  std::vector<std::shared_ptr<ucx_internal::PeerState>> connecting_;
  absl::Duration connect_timeout_;
  const bool shared_memory_only_;  // UcxOptions::tls names shared-memory transports alone

  std::mutex join_mu_;  // one joiner at a time
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_
