// The raw verbs backend (engine/transport/transport.h) over the verbs seam (verbs_api.h): RC
// queue pairs and IBV_WR_RDMA_WRITE, on rdma-core's libibverbs or on the software provider
// (engine/transport/verbs/softverbs), which runs the same calls without a NIC.
//
// Rails and lanes: the transport opens one rail per RDMA device port (verbs_rail.h; GID and
// MTU chosen there) and binds lane i to rail i % rails: each lane has its own completion queue
// and event channel on its rail and a thread that polls it. Every registered region is
// registered with every rail's protection domain; its descriptor remote_key is one rkey per
// rail, 4 LE bytes each. Each lane's descriptor address is a VerbsLaneAddress
// (proto/kvrail/v1/verbs.proto): rail, device, port, LID, GID, MTU, speed, provider, and the
// transport's connect endpoint.
//
// Connect asks the peer's connect endpoint for responder QPs (verbs_connector.h), one per local
// lane, each on the peer lane i % the peer's lanes, and drives its own QPs RESET -> INIT -> RTR
// -> RTS with the answer (path MTU: the smaller of both ports'). A peer answers connects from a
// thread of its own and keeps at most VerbsOptions::max_connections of them; Disconnect and
// Close release them.
//
// GPU memory (Capabilities::gpu_memory): a CUDA region is registered as a dmabuf
// (ibv_reg_dmabuf_mr, at its device address as IOVA) where libibverbs and the GPU's driver offer
// it, else with ibv_reg_mr on the device pointer where nvidia-peermem is loaded; otherwise
// Register refuses it naming why, and the caller stages through host memory.
//
// Posting: PostWrites checks the batch (bounds.h), then turns it into a chain of RDMA-write work
// requests posted with one post_send (one doorbell) on the (peer, lane) QP, signalling only the
// last work request of each chain; at most VerbsOptions::max_send_wr work requests are
// outstanding per QP, and a batch that does not fit waits in the QP's queue for the lane thread
// to post it as completions free room. RC completes work requests in order, so a batch's
// signalled completion means every write of it, and of every batch before it on that QP, was
// acknowledged by the peer's NIC: a batch completes OK only once its bytes are in the peer's
// memory. A Flush completes when everything posted before it on the QP has completed.
//
// Errors: a work completion that is not IBV_WC_SUCCESS fails its batch with kUnavailable naming
// the status ("IBV_WC_REM_ACCESS_ERR: remote access error", the device, lane and peer), moves
// the QP to the error state, fails every later batch and flush queued on it the same way, and
// replaces the QP: a worker thread asks the peer for a fresh responder QP and drives a new pair to
// RTS; batches posted meanwhile wait for it (or fail with its error if the reconnect fails). A
// retry-exceeded completion (the peer's process gone, stopped or cut off) is reported as such.
//
// Fencing (transport.h): (a) a Flush that completed OK means every earlier write of its lane
// landed. (b) Disconnect moves the peer's QPs to the error state and destroys them before it
// returns: on a NIC the QP then sends nothing more, and the software provider drops every packet
// of the QP still queued at the responder (softverbs.h, "Fencing"). So disconnect_fences is
// true. On the responder side, Deregister deregisters the region's MRs: later writes into it
// complete at the writer with a remote access error and change nothing.
//
// Threads and locks: mu_ (a reader-writer lock) guards the regions and peers tables; each
// (peer, lane) QP has its own mutex, held while its work requests are built and posted and
// never across a wait; each lane has a mutex for its table of QPs and its queue of completions
// to deliver. Order: mu_, then a QP's, then its lane's. Completions run on the lane's thread with
// no lock held.
//
// Files, one seam each (namespace verbs_internal but this facade):
//   verbs_api.h, libibverbs_api.cc  the seam every verbs call goes through
//   verbs_rail.*       a rail: device, port, PD, GID (the context)
//   rails.*            multi-rail planning (pure)
//   verbs_lane.*       a lane: its CQs and event channels, its thread, its completions
//   verbs_qp.*         a QP driven RESET -> INIT -> RTR -> RTS, and destroyed
//   verbs_peer.h       a peer and, per lane, its QP's queue of batches and flushes
//   verbs_posting.cc   posting, completions, failure and failover of a QP's queue
//   verbs_connect.cc   the QP exchange, both ends (requester and responder), retiring QPs
//   verbs_worker.cc    reconnects, releases and rail probes, off the lanes' threads
//   verbs_memory.*     registration: MRs per rail, rkeys packed and unpacked
//   verbs_connector.*  the QP exchange's wire (ZeroMQ)
//   verbs_transport.*  the Transport facade that wires these together
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_TRANSPORT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/transport/region_table.h"
#include "engine/transport/transport.h"
#include "engine/transport/verbs/rails.h"
#include "engine/transport/verbs/verbs_api.h"
#include "proto/kvrail/v1/handshake.pb.h"
#include "proto/kvrail/v1/verbs.pb.h"

namespace kvrail::transport {

struct VerbsOptions {
  // The seam: LibibverbsApi() or softverbs::SoftVerbsApi(). Must outlive the transport.
  const VerbsApi* api = nullptr;
  int lanes = 2;
  // RDMA devices to use as rails, in order; empty: every device with an active port, or, with
  // `rail_affinity`, the ones nearest the arena it names (rails.h, RailsForAffinity: a GPU's
  // NIC on its PCIe switch, or the NICs on a NUMA node), read from the sysfs tree at
  // `sysfs_root`.
  std::vector<std::string> devices;
  std::string rail_affinity;
  std::string sysfs_root = "/sys";
  uint8_t port = 1;
  // A GID index to use on every rail; -1 chooses (verbs_rail.h).
  int gid_index = -1;
  // Where the connect endpoint binds and what peers are told to reach it at; empty: the IPv4
  // address of the first rail's GID (RoCE v2), else 127.0.0.1.
  std::string connect_host;
  uint64_t max_write_bytes = uint64_t{16} << 20;
  uint64_t max_inflight_bytes_per_endpoint = uint64_t{256} << 20;
  // Work requests outstanding per QP (capped by the device's max_qp_wr).
  uint32_t max_send_wr = 256;
  // Scatter-gather entries a work request may carry (capped by every rail's device max_sge): a
  // source-strided copy landing as contiguous bytes goes as one RDMA write gathering up to this
  // many rows (Capabilities::max_gather_rows). 1 gathers none.
  uint32_t max_send_sge = 30;
  // RC retry budget: 4.096 us x 2^timeout x (retry_cnt + 1) before a write to a silent peer fails
  // with IBV_WC_RETRY_EXC_ERR. 14 and 7: about 0.5 s.
  uint8_t qp_timeout = 14;
  uint8_t qp_retry_cnt = 7;
  absl::Duration connect_timeout = absl::Seconds(5);
  // How long replacing a failed QP may take (the peer's answer to a new connect request).
  absl::Duration reconnect_timeout = absl::Seconds(1);
  // Multi-rail: a rail whose path failed leaves rotation for this long (doubling on each failed
  // probe, up to 16x); a batch is sent on at most max_attempts QPs before it fails.
  absl::Duration rail_probe_after = absl::Seconds(1);
  int max_attempts = 3;
  // Responder QP sets (one per peer Connect) kept at once; a connect beyond them is refused.
  int max_connections = 1024;
  // Sent to every peer this transport connects to as its name as a writer (TransportSpec).
  std::string writer_name;
};

namespace verbs_internal {
struct LaneState;
struct PeerState;
struct QpState;
struct RegionState;
struct Op;
struct Responder;
}  // namespace verbs_internal

class Rail;
class VerbsConnectServer;

class VerbsTransport final : public Transport {
 public:
  // Opens the rails, creates each lane's completion queue and thread, and starts the connect
  // endpoint. InvalidArgument for no api, lanes < 1, max_write_bytes 0 or max_send_wr < 2; the
  // rails' errors (verbs_rail.h) otherwise.
  static absl::StatusOr<std::unique_ptr<VerbsTransport>> Create(const VerbsOptions& options);

  ~VerbsTransport() override;
  VerbsTransport(const VerbsTransport&) = delete;
  VerbsTransport& operator=(const VerbsTransport&) = delete;

  const Capabilities& capabilities() const override { return capabilities_; }
  absl::StatusOr<RegionId> Register(const LocalRegion& region) override;
  // The memfd placement (shared_region.h), registered with every rail.
  absl::StatusOr<SharedRegion> Allocate(uint64_t length) override;
  // Destroys the responder QPs of every connection the writer named `writer` made so far: what
  // it sent that has not landed yet lands nowhere (a peer that then writes on them fails). The
  // number of QPs destroyed.
  absl::StatusOr<size_t> RefuseWriter(std::string_view writer) override;
  absl::Status Deregister(RegionId region) override;
  absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const override;
  absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& peer) override;
  absl::Status PostWrites(PeerId peer, int lane, RegionId source, absl::Span<const Write> writes,
                          Completion done) override;
  absl::Status Flush(PeerId peer, int lane, Completion done) override;
  absl::Status Disconnect(PeerId peer) override;
  void Close() override;

  // The rails' device names, in rail order, and the provider ("libibverbs", "softverbs").
  std::vector<std::string> rail_devices() const;
  // Each lane's home rail (an index into rail_devices()).
  std::vector<int> lane_rails() const;
  // Rails in rotation now, and how many times a QP failed over from a rail.
  std::vector<int> rails_in_rotation() const;
  uint64_t failovers() const;
  TransportCounters transport_counters() const override;
  const char* provider() const { return api_.provider; }

 private:
  explicit VerbsTransport(const VerbsOptions& options);
  absl::Status Init();

  // One work completion of `lane`'s CQ.
  void OnCompletion(verbs_internal::LaneState& lane, const ibv_wc& wc);
  // QP mutex held: posts what fits of the QP's queued ops.
  void PumpLocked(verbs_internal::QpState& qp);
  // QP mutex held: the QP failed with `status`: to the error state (destroyed on the worker);
  // its ops fail,
  // or, for a failed path (`path_failure`) with other rails to take it, wait for a QP on
  // another rail; a reconnect is scheduled for whatever waits.
  void FailQpLocked(verbs_internal::QpState& qp, const absl::Status& status, bool path_failure);
  // QP mutex held: the QP leaves its lane's table and goes to the error state (the fence:
  // nothing it posted lands once that returns), then is destroyed and the peer is told to
  // release its responder QP. `when` says where the destroy runs: here (Disconnect and Close,
  // which promise the QPs are gone when they return), or on the worker (a QP that failed or
  // moves rail, retired on its lane's thread: a destroy is a firmware command on a NIC, and
  // the lane's other QPs would wait behind it). Nothing without a QP.
  enum class Destroy { kNow, kOnWorker };
  void RetireQpLocked(verbs_internal::QpState& qp, Destroy when);
  // Every QP of `peer` retired and closed, its batches and flushes completed with `cancelled`.
  void ClosePeer(verbs_internal::PeerState& peer, const absl::Status& cancelled);
  // The rail for a QP of a lane whose home is `home`: home if in rotation and not `avoid`, else
  // the first rail in rotation that is not `avoid`, else home.
  int ChooseRail(int home, int avoid);
  // On the worker: rails whose backoff passed are probed (see the .cc).
  void ProbeRails();
  // QP mutex held: `op` is done; its completion is queued on the lane for delivery.
  void FinishLocked(verbs_internal::QpState& qp, verbs_internal::Op* op, absl::Status status);
  // QP mutex held: the flush `flush` is done; it reports the first failure on the QP since the
  // previous flush, else `otherwise`, and the next flush starts from none.
  void FinishFlushLocked(verbs_internal::QpState& qp, verbs_internal::Op* flush,
                         const absl::Status& otherwise = absl::OkStatus());
  // QP mutex held: `status` is what the next flush reports, unless an earlier failure is.
  static void NoteFailureLocked(verbs_internal::QpState& qp, const absl::Status& status);

  // Connect exchange: a requester QP for each of `lanes` of `peer`, on the QP's chosen rail to
  // its chosen peer lane, each exchange waiting at most `timeout`.
  absl::Status ConnectLanes(verbs_internal::PeerState& peer, const std::vector<int>& lanes,
                            absl::Duration timeout);
  // The responder's side (on the connect endpoint's thread).
  v1::VerbsConnectReply OnConnectRequest(const v1::VerbsConnectRequest& request);
  void OnRelease(const v1::VerbsRelease& release);

  // The reconnect and release worker.
  void RunWorker();
  void ScheduleReconnect(std::shared_ptr<verbs_internal::PeerState> peer, int lane);

  const VerbsApi& api_;
  VerbsOptions options_;
  Capabilities capabilities_;
  // How GPU memory is registered (fixed by Init), and why it cannot be when it cannot.
  enum class GpuRegistration { kNone, kDmabuf, kPeermem };
  GpuRegistration gpu_registration_ = GpuRegistration::kNone;
  std::string gpu_reason_;
  std::vector<std::unique_ptr<Rail>> rails_;
  std::vector<std::unique_ptr<verbs_internal::LaneState>> lanes_;
  std::unique_ptr<VerbsConnectServer> connect_server_;
  std::string connect_endpoint_;

  mutable std::shared_mutex mu_;
  bool closed_ = false;
  PeerId next_peer_ = 1;
  uint64_t next_connection_ = 1;
  // The registrations and the descriptor version (region_table.h).
  RegionTable<std::shared_ptr<verbs_internal::RegionState>> regions_;
  std::map<PeerId, std::shared_ptr<verbs_internal::PeerState>> peers_;

  // The responder QPs of peers' connects, by connection id.
  std::mutex responders_mu_;
  std::map<std::string, std::unique_ptr<verbs_internal::Responder>> responders_;
  std::vector<ibv_cq*> responder_cqs_;  // one per rail: responder QPs post nothing

  std::mutex worker_mu_;
  std::condition_variable worker_cv_;
  std::deque<std::function<void()>> worker_jobs_;
  bool worker_stop_ = false;
  std::thread worker_;

  mutable std::mutex health_mu_;
  std::unique_ptr<RailHealth> health_;  // health_mu_'s
  uint64_t failovers_ = 0;              // health_mu_'s

  std::mutex close_mu_;
};

// Lane i's home rail for `lanes` lanes over rails of these speeds (Gb/s; 0 counts as 1): lanes
// go to rails in proportion to their speeds (D'Hondt), ties to the lower index, so that the
// scheduler's striping over lanes weights the rails by link speed. {400, 200}, 6 lanes:
// 0, 1, 0, 0, 1, 0.
std::vector<int> AssignLanesToRails(int lanes, const std::vector<uint32_t>& gbps);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_TRANSPORT_H_
