// The UCX backend (engine/transport/transport.h): one ucp_context per transport, one ucp_worker
// per lane, ucp_put_nbx for writes and ucp_ep_flush_nbx for Flush.
//
// Threading: each lane is a UCX worker (UCS_THREAD_MODE_SERIALIZED) with a mutex and a progress
// thread of its own, so lanes post, copy and progress on different cores at once (over shared
// memory a put is the initiator's memcpy). Every UCX call on a worker, ours and its thread's
// ucp_worker_progress, runs under that lane's mutex, and so do UCX's request callbacks, which
// only move finished completions onto the lane's ready list; the lane's thread delivers them
// with no lock held. Transport-wide state (regions, peers, closed) is written holding the
// transport's mutex and every lane's, and read holding either: a post or a flush takes only its
// own lane's mutex, so lanes never touch a lock another lane uses. Lock order: the transport's
// mutex, then lanes in index order.
//
// UCX 1.13 emulates puts into user memory over active messages (docs MACHINE-NOTES), so the
// TARGET transport's progress threads must run for a write to land: they always do while the
// transport is open. Memory from Allocate over shared memory is written with plain stores.
//
// Fencing (transport.h), as the code does it: (a) Flush is ucp_ep_flush_nbx on the lane's
// endpoint, which completes once every earlier put completed at the peer (landed or failed);
// its status is the first failure of an earlier batch, else the flush's own. When the endpoint
// has failed (UCX's peer-failure handling, tcp only) Flush completes at once with that error
// and UCX sends nothing more on the endpoint. (b) Disconnect cancels the peer's completions and
// closes its endpoints with ucp_ep_close_nbx in flush mode, not UCP_EP_CLOSE_FLAG_FORCE (force
// aborts the target in UCX 1.13, see ClosePeer), so it does NOT fence: puts UCX had accepted
// still go out, and land, after Disconnect returned and its kCancelled completions were
// delivered (over sm they sit in the peer's FIFO, over tcp in the socket). No call reports when
// those closes finish. Close fences: each lane waits for its endpoints' closes (up to 10 s),
// that is for every accepted put to complete at the peer, before its worker goes; past that
// bound, puts already in a stalled peer's FIFO or socket may land when it progresses again.
//
// Known limits (UCX, not this code): a write into a region the peer has deregistered is not
// detected, because UCX's software put handler at the target copies to the address without
// checking it against a registration; and over shared memory in one process a closed peer is
// never reported dead (UCX's keepalive checks the peer's pid, which is alive). See
// ucx_conformance_test and its BUILD target.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_

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
};

// The UCX environment that gives another UCX program (ucx_perftest) the settings `options`
// gives a UcxTransport beyond TLS and NET_DEVICES: {"UCX_TCP_TX_SEG_SIZE", "65536"}, ...
std::vector<std::pair<std::string, std::string>> UcxTuningEnvironment(const UcxOptions& options);

namespace ucx_internal {
struct Lane;
struct Op;
struct PeerState;
struct RegionState;
}  // namespace ucx_internal

class UcxTransport final : public Transport {
 public:
  // InvalidArgument for lanes < 1 or max_write_bytes == 0; Unavailable (with UCX's status
  // string) when UCX cannot create the context or a worker. Starts the progress thread.
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
  // every lane.
  void ClosePeer(const std::shared_ptr<ucx_internal::PeerState>& peer, const char* why);
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

  static void OnPutDone(void* request, int /*ucs_status_t*/ status, void* user_data);

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
  bool peer_errors_ = true;  // endpoints ask UCX for peer-failure handling

  std::mutex join_mu_;  // one joiner at a time
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_TRANSPORT_H_
