// The UCX backend (engine/transport/transport.h): one ucp_context per transport, one ucp_worker
// per lane. Over shared memory only (tls "sm,self") a write is ucp_put_nbx and a Flush is
// ucp_ep_flush_nbx. Wherever tcp may carry the bytes (tls naming tcp, or UCX's default), a write
// is a train of active messages and a Flush is a round trip through the peer (see "Writes over
// tcp" below).
//
// Threading: each lane is a UCX worker (UCS_THREAD_MODE_SERIALIZED) with a mutex and a progress
// thread of its own, so lanes post, copy and progress on different cores at once (over shared
// memory a put is the initiator's memcpy). Every UCX call on a worker, ours and its thread's
// ucp_worker_progress, runs under that lane's mutex, and so do UCX's callbacks (request
// completions, endpoint errors, active messages), which copy peers' writes in and move finished
// completions onto the lane's ready list; the lane's thread delivers them with no lock held.
// Transport-wide state (regions, peers, closed) is written holding the transport's mutex and every
// lane's, and read holding either: a post or a flush takes only its own lane's mutex, so lanes
// never touch a lock another lane uses. Lock order: the transport's mutex, then lanes in index
// order.
//
// Connect holds no lock while it waits: it creates the peer's endpoint on each lane holding only
// that lane's mutex, starts UCX's wireup there (a flush of the new endpoint), and waits for every
// lane's wireup, up to UcxOptions::connect_timeout, holding nothing; the lanes' threads progress
// the wireup meanwhile. Only then does it publish the peer, under the transport's mutex and every
// lane's, for a moment. So one peer that never answers (stopped, unreachable) costs its own
// Connect, never another peer's posts, flushes or Connect.
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
// refused, and the next Flush says so); a Flush sends the number of messages the lane sent and
// completes when the target answers that it has handled that many. The target sends nothing but
// those answers, and a failed answer is only a failed request: a writer that dies mid-room costs
// the target nothing. Shared memory keeps UCX's puts: an acknowledgement goes into the writer's
// receive FIFO, which stays mapped in the target when the writer dies, so sending one never fails
// (at worst it waits for room).
//
// Peer failure: endpoints ask UCX for peer-failure handling (UCP_ERR_HANDLING_MODE_PEER) on tcp
// and on shared memory (UCX 1.13 offers it there only with UCX_MM_ERROR_HANDLING=y in the
// environment, which the first transport of a process sets unless the operator chose it). A peer
// whose process died fails its endpoints at once over tcp (its kernel resets the connection) and
// within about UcxOptions::keepalive_interval over shared memory (UCX's keepalive finds its
// process gone; a zombie that its parent has not reaped still counts as alive). Then its batches
// and flushes fail with kUnavailable. A peer that is alive but stopped fails nothing: only the
// caller's deadlines end its rooms.
//
// Fencing, for this backend (what the generic contract in transport.h leaves to each one):
//   * A Flush of (peer, lane) that completed OK means every write posted there before it has
//     been copied into the peer's memory: over tcp the peer answered after copying every one of
//     them; over shared memory UCX's flush saw every put acknowledged (or, into memory from the
//     peer's Allocate, stored). A failed Flush says nothing about which of them landed.
//   * Disconnect (and Close) deliver the peer's outstanding completions as kCancelled and close
//     its endpoints with UCP_EP_CLOSE_FLAG_FORCE (a flushing close where an endpoint fell back to
//     no error handling): writes still queued inside UCX are dropped and nothing more leaves this
//     process for that peer. Writes UCX already handed over (to the kernel's socket buffers over
//     tcp, into the peer's receive FIFO over shared memory) may still be copied by the peer after
//     Disconnect returns; only a completed Flush, or the peer's death, says that none will.
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
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <atomic>
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
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

struct UcxOptions {
  int lanes = 2;
  // Written to UCX's TLS setting as given ("sm,self", "tcp", ...); empty keeps UCX's default
  // (or the UCX_TLS environment variable).
  std::string tls;
  // Written to UCX's NET_DEVICES setting as given ("lo" for tcp on loopback); empty keeps the
  // default.
  std::string net_devices;
  uint64_t max_write_bytes = uint64_t{16} << 20;
  uint64_t max_inflight_bytes_per_endpoint = uint64_t{64} << 20;
  // UCX's tcp segment sizes in bytes (UCX_TCP_TX_SEG_SIZE, UCX_TCP_RX_SEG_SIZE). UCX's own
  // defaults (8 KiB and 64 KiB) cut every put into 8 KiB sends, each one send(2) and a trip
  // through the peer's progress; 64 KiB and 256 KiB moved 2.5x the bytes per second on this
  // machine's loopback and veth (bench/raw/README.md). 0 keeps UCX's default; UCX_TCP_TX_SEG_SIZE
  // or UCX_TCP_RX_SEG_SIZE in the environment wins over these. Create rejects a tx segment
  // outside [1 KiB, 16 MiB] and an rx segment smaller than the tx one (a peer's rx segment must
  // hold this side's tx segment: give both ends the same options).
  uint64_t tcp_tx_seg_bytes = uint64_t{64} << 10;
  uint64_t tcp_rx_seg_bytes = uint64_t{256} << 10;
  // How often UCX checks that its peers are alive (UCX_KEEPALIVE_INTERVAL; also tcp's keepalive
  // idle time and probe interval, UCX_TCP_KEEPIDLE and UCX_TCP_KEEPINTVL, in whole seconds). A
  // peer process that died is seen within about this over shared memory, where nothing else
  // tells; over tcp its kernel usually resets the connection at once, and keepalive catches a
  // host or link that vanished. UCX's defaults are 20 s and 10 s; zero keeps them; the
  // operator's environment wins. Create rejects a negative interval.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // How long Connect waits for UCX's wireup with every lane of the peer; then it fails with
  // DeadlineExceeded naming the peer. Create rejects a timeout that is not positive.
  absl::Duration connect_timeout = absl::Seconds(5);
};

// The UCX environment that gives another UCX program (ucx_perftest) the settings `options`
// gives a UcxTransport beyond TLS and NET_DEVICES: {"UCX_TCP_TX_SEG_SIZE", "65536"}, ...
std::vector<std::pair<std::string, std::string>> UcxTuningEnvironment(const UcxOptions& options);

namespace ucx_internal {
struct ConnectWait;
struct Lane;
struct Op;
struct PeerState;
struct RegionState;
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

  // The lane's progress thread: progress, reap closed endpoints, deliver completions; at Close,
  // tear the lane down and deliver what is left.
  void RunLane(ucx_internal::Lane& lane);
  bool OnLaneThread() const;
  // After every lane's thread has ended: unmaps the regions and destroys the workers.
  void ReleaseAll();
  // mu_ and every lane's mutex held: cancels `peer`'s operations and closes its endpoints on
  // every lane. Once per peer; later calls do nothing.
  void ClosePeer(const std::shared_ptr<ucx_internal::PeerState>& peer, const char* why);
  // Connect's first half, holding only `lane`'s mutex: the endpoint, its rkeys and the wireup
  // flush whose completion tells `wait`. An error means the lane was not started.
  absl::Status StartLaneConnect(ucx_internal::Lane& lane, ucx_internal::PeerState& state,
                                const v1::HandshakeDescriptor& peer,
                                const std::shared_ptr<ucx_internal::ConnectWait>& wait);
  // The active-message write path (over tcp, see above): PostWrites' and Flush's sends.
  void PostAmWritesLocked(ucx_internal::Lane& home, ucx_internal::PeerState& state,
                          ucx_internal::Op* op, const std::byte* base,
                          absl::Span<const Write> writes, absl::FunctionRef<std::string()> context);
  void SendAmFlushLocked(ucx_internal::PeerState& state, ucx_internal::Op* op);
  // Any lane's mutex held (a lane thread, in UCX's active-message callback): whether
  // [address, address + length) lies inside one registered region.
  bool RegisteredLocked(uint64_t address, uint64_t length) const;
  // What a post and a flush start with: `done` is set, the lane exists, its mutex is held
  // (`lock`) and `peer` is connected. Errors carry context().
  struct Started {
    std::unique_lock<std::mutex> lock;
    ucx_internal::Lane* home;
    ucx_internal::PeerState* state;
  };
  absl::StatusOr<Started> Start(PeerId peer, int lane, const Completion& done,
                                absl::FunctionRef<std::string()> context);
  // mu_ or any lane's mutex held: the connected peer, or why not.
  absl::StatusOr<ucx_internal::PeerState*> FindPeerLocked(PeerId peer, int lane) const;

  // The target's side of an active-message write (a ucp_am_recv_callback_t; arg is the Lane):
  // checks it against the registered regions and copies it in.
  static int /*ucs_status_t*/ OnWriteAm(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length, const void* param);

  Capabilities capabilities_;

  void* context_ = nullptr;  // ucp_context_h, destroyed by the destructor
  // One per lane, fixed once Init returns; each guards itself (see ucx_internal::Lane).
  std::vector<std::unique_ptr<ucx_internal::Lane>> lanes_;
  std::vector<std::thread::id> lane_threads_;  // written by Create before anyone can call back

  mutable std::mutex mu_;
  // Written with mu_ and every lane's mutex held; read with either (a post holds only its
  // lane's). allocated_ and next_* are mu_'s alone.
  bool closed_ = false;    // Close was called: no new work
  bool released_ = false;  // ReleaseAll ran: regions unmapped, workers destroyed
  uint64_t version_ = 1;
  RegionId next_region_ = 1;
  PeerId next_peer_ = 1;
  std::map<RegionId, std::unique_ptr<ucx_internal::RegionState>> regions_;
  std::map<RegionId, std::unique_ptr<Arena>> allocated_;  // Allocate's memfd placements
  std::map<PeerId, std::shared_ptr<ucx_internal::PeerState>> peers_;
  // mu_'s alone: peers whose Connect is waiting for wireup, so that Close can end them.
  std::vector<std::shared_ptr<ucx_internal::PeerState>> connecting_;
  // Endpoints ask UCX for peer-failure handling; cleared, once, when UCX has none to give.
  std::atomic<bool> peer_errors_{true};
  // Fixed by Init: writes go as active messages of at most am_slice_bytes_ (tcp may carry them).
  bool am_writes_ = false;
  uint64_t am_slice_bytes_ = 0;
  absl::Duration connect_timeout_;

  std::mutex join_mu_;  // one joiner at a time
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_
