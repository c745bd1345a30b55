// The data-plane seam: what every backend (ucx/, verbs/, loopback/) does, and nothing else.
//
// A Transport registers local memory, describes it to peers in the handshake descriptor
// ("Handshake beside CachePD"), connects to a peer from the peer's descriptor, and posts batches
// of one-sided writes into the peer's registered regions on one of its lanes. Slicing, striping
// over lanes, bounding bytes in flight and deadlines belong to the scheduler above
// (engine/transfer), not here.
//
// Completion contract, for every backend:
//   * A call that returns an error posted nothing and never calls its completion.
//   * A call that returns OK calls its completion exactly once, never inline from the posting
//     call, always from the transport's progress context (a thread the transport owns).
//   * A batch's completion with OK means the batch is locally complete: its source bytes may be
//     reused. Only a Flush's OK means earlier writes landed at the peer ("Success means landed").
//   * Disconnect and Close fail outstanding completions with kCancelled. A write that finds its
//     peer or its peer's region gone fails with kUnavailable: its batch, when the loss is seen
//     before the batch completes locally, and always the next Flush of that lane.
//   * Completions run without the transport's locks held: they may post, flush, register or
//     disconnect. They must not destroy the transport.
//
// Fencing: a room may be reported failed, and its pages reused, only once no write posted for it
// can land any more. A caller knows that of the writes posted on (peer, lane) in two ways:
//   (a) A Flush of that lane completed. OK: every write posted there before the Flush landed.
//       An error: some of the writes posted there since the previous Flush failed (a failed batch
//       may have landed in part), and each backend says below whether the rest can still land.
//   (b) Disconnect(peer) returned and the completions of the peer's outstanding batches and
//       flushes were delivered: nothing posted to the peer lands afterwards. Close is (b) for
//       every peer once it returns.
// How each backend fences, and where it falls short (its header says more):
//   * loopback: a completion comes after its memcpys, and a Flush runs after every earlier
//     batch (one queue per transport): after a Flush, OK or not, nothing before it lands.
//     Disconnect: no write to the peer starts once it returns, and the one copying then has
//     ended before its batch's completion.
//   * ucx: where tcp may carry the bytes, writes are kvrail's own active messages and a Flush
//     sends the lane's count of them, completing OK once the target answers that it checked and
//     copied that many (a refused write fails it); over shared memory a Flush is
//     ucp_ep_flush_nbx, which completes once every earlier put has completed at the peer (stores
//     into a peer's mapped segment are done, behind a release fence, before it), and OK only
//     while the peer's process lives (engine/transport/peer_process.h). An error
//     without an answer: the endpoint had failed (peer-failure handling), and UCX sends nothing
//     more on a failed endpoint. Disconnect does NOT fence (b):
//     it force-closes the endpoints (UCP_EP_CLOSE_FLAG_FORCE) and cancels the peer's queued
//     work, but writes UCX already handed over (to the kernel's socket buffers over tcp, into
//     the peer's receive FIFO over shared memory) may still be copied by the peer after it
//     returned (Capabilities::disconnect_fences is false; ucx_transport.h, "Fencing"). Close
//     fences where the peer answers: over tcp each lane first sends every peer a last flush and
//     closes its endpoint once the target answered it (every message before it copied), or after
//     2 s; then it waits for the closes, up to 10 s per lane, before the workers go.
//   * verbs: a batch completes OK only once the peer's NIC acknowledged its last write (RC
//     completes in order), and a Flush after every earlier batch of its QP. A failed completion
//     moves the QP to the error state before the batch's failure is delivered (the QP is
//     destroyed later, on the backend's worker), and Disconnect and Close move the peer's QPs to
//     the error state and destroy them before they return: nothing posted on them lands
//     afterwards (on a NIC a QP in the error state sends nothing; the software provider drops
//     the packets it still holds for it, verbs/softverbs/softverbs.h, "Fencing").
//   * fault (engine/transport/fault): held calls never reach the inner transport and are
//     cancelled by Disconnect and Close; forwarded ones fence as the inner backend does.
// A writer found gone (its process died) fences on a target that refuses it (RefuseWriter, where
// Capabilities::refuses_writers): nothing of what it sent before it went lands afterwards,
// whenever the target reads it.
// The conformance suite checks (a) OK and (b) on every backend (FlushOkMeansEveryEarlierWrite-
// Landed, NoWriteLandsAfterDisconnectReturns, NoWriteLandsAfterCloseReturns); ucx's target
// filters the Disconnect one, for the reason above; verbs runs all of them.
//
// Every method is thread-safe.
#ifndef KVRAIL_ENGINE_TRANSPORT_TRANSPORT_H_
#define KVRAIL_ENGINE_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport {

// What a backend can do. Fixed for the life of a transport.
struct Capabilities {
  std::string name;  // "ucx", "verbs", "loopback"
  // Independent queues of writes. Lane i of a local transport writes through the peer's lane
  // i % (the peer descriptor's lane count).
  int lanes = 1;
  bool one_sided = true;    // writes need no action from the peer's application
  bool gpu_memory = false;  // LocalRegion::cuda may be registered
  // The largest single Write the backend accepts; the scheduler slices copies to at most this.
  uint64_t max_write_bytes = 0;
  // Advice for the scheduler: keep at most this many bytes posted and not yet complete per
  // peer (UCX over tcp collapses when many large puts are in flight). Not enforced here.
  uint64_t max_inflight_bytes_per_endpoint = 0;
  // Whether a link that failed or was disconnected fences (see "Fencing"): once a Flush failed,
  // or Disconnect returned and the peer's cancelled completions were delivered, no write posted
  // to the peer lands any more. False where writes already handed over (to the kernel's socket
  // buffers, to the peer's receive queue) may still be copied by the peer afterwards (UCX: a
  // stopped peer that resumes): there only a Flush that completed OK, or the peer's death,
  // proves it.
  bool disconnect_fences = true;
  // Whether a Write may carry several rows (Write::rows > 1): a head-sliced page moved as one
  // unit. Where false, the scheduler posts one Write per row, except as max_gather_rows allows,
  // and a batch with any other strided write is refused (CheckWrites).
  bool strided_writes = false;
  // Where strided_writes is false: the most rows one Write may gather from a strided source
  // into contiguous bytes at the peer (remote_stride == length), as one RDMA write with a
  // scatter-gather list of that many entries (verbs: the devices' max_sge, queried). 1: none.
  uint32_t max_gather_rows = 1;
  // Whether a strided write whose rows land apart (remote_stride > length) is placed by one
  // operation of the backend (UCX over shared memory: the lane's stores into the mapped
  // segment; UCX over tcp: one rows message; loopback: memcpy in this process), not by an
  // operation per row (a put or an RDMA write each: UCX where it may choose RDMA, verbs). A
  // decode's row staging serves, in its auto mode, the routes where it is false.
  bool lands_rows_apart_whole = false;
  // Whether the peer's lane thread receives what a lane writes: it reads the lane's connection
  // and copies each message into place (UCX where tcp may carry the writes: kvrail's active
  // messages). Where true, a peer lane that reads several writers' connections pays for each of
  // them, so writers that share a peer may keep to lanes of their own (transfer::WriterLanes).
  // False where the writer or its NIC places the bytes (shared memory's stores, RDMA).
  bool peer_lanes_receive = false;
  // Whether a lane stores in one pass the slices that batches of several peers read of the same
  // source rows (UCX over shared memory alone: decision 0020). Where true, the scheduler puts a
  // transfer's k-th batch on its k-th lane (mod its lanes) while that lane has room, so that
  // transfers cut alike (a prefill of the smaller TP sending each decode rank its heads of the
  // same source rows) put their batches of the same rows on one lane. Elsewhere (tcp, whose lanes
  // pack each peer's messages apart; RDMA, where the NIC reads; loopback) each batch goes to the
  // lane with the fewest bytes in flight, so a faster lane or rail takes more.
  bool lanes_share_rows = false;
  // Whether RefuseWriter refuses what a named writer sends from then on: UCX where tcp may carry
  // the writes (the target's lanes land every write, and refuse those), verbs (the writer's
  // responder QPs are destroyed). False for UCX over shared memory, where the writer stores into
  // the pages itself and nothing it writes passes through this side (once its process is gone it
  // stores nothing more), and for loopback; there RefuseWriter refuses nothing.
  bool refuses_writers = false;
};

// The most rows one Write of `length`-byte rows landing `remote_stride` apart may carry on a
// backend of `caps`: any number where it takes strided writes; up to max_gather_rows where the
// rows land as contiguous bytes; else 1. The scheduler cuts writes by it and CheckWrites holds
// batches to it.
inline uint64_t MaxRowsPerWrite(const Capabilities& caps, uint64_t length, uint64_t remote_stride) {
  if (caps.strided_writes) return UINT64_MAX;
  return remote_stride == length ? caps.max_gather_rows : 1;
}

// Events of a transport's life that change no result but an operator wants counted.
struct TransportCounters {
  // Batches moved off a rail whose path failed onto another rail (verbs multi-rail failover).
  uint64_t rail_failovers = 0;
  // Sleeps of an idle lane's thread (UCX), by what ended them: an event of the lane's worker (a
  // peer's message, a socket that takes more bytes), a queued job (or the transport's close),
  // the end of the nap (1 ms, the bound for what UCX does not signal).
  uint64_t lane_wakes_by_event = 0;
  uint64_t lane_wakes_by_job = 0;
  uint64_t lane_naps_ended = 0;
  // Writes stored a source row at a time together with other peers' writes of slices of the
  // same rows (UCX over shared memory: decision 0020).
  uint64_t writes_stored_together = 0;
};

// Local memory to register: [base, base + length) in this process (a device address if cuda).
struct LocalRegion {
  void* base = nullptr;
  uint64_t length = 0;
  bool cuda = false;
};

// Names a local registration. Never reused within one transport.
using RegionId = uint32_t;
// Names a connection made by Connect. Never reused within one transport.
using PeerId = uint32_t;

// One one-sided write: `length` bytes from `local_offset` in the batch's source region to
// `remote_address`, an absolute address inside one of the peer's descriptor regions. With
// `rows` > 1 (only as MaxRowsPerWrite allows) it writes that many rows of `length`
// bytes, row r from local_offset + r * local_stride to remote_address + r * remote_stride (each
// stride at least `length`); every row lies inside the source region and inside the same one of
// the peer's regions.
struct Write {
  uint64_t local_offset = 0;
  uint64_t remote_address = 0;
  uint64_t length = 0;
  uint64_t rows = 1;
  uint64_t local_stride = 0;
  uint64_t remote_stride = 0;
};

// The bytes a write moves (rows x length) and the span of its rows at the peer, for a write
// CheckWrites accepted (engine/base/rows.h measures any).
inline uint64_t PayloadBytes(const Write& w) { return w.rows * w.length; }
inline uint64_t RemoteSpan(const Write& w) { return (w.rows - 1) * w.remote_stride + w.length; }

// Host memory that Transport::Allocate made and registered, and how another process on this
// host maps the same pages: it opens /proc/<this process's pid>/fd/<fd> read-write and maps it;
// the region starts `fd_offset` bytes into that file.
struct SharedRegion {
  RegionId region = 0;
  void* base = nullptr;  // `length` bytes in this process, valid until Deregister or Close
  uint64_t length = 0;
  int fd = -1;  // owned by the transport: open until Deregister(region) or Close
  uint64_t fd_offset = 0;
  // Where the backend placed the pages: "memfd" (a memfd registered as Register would), or
  // "ucx-shm" (UCX's own shared-memory segment, which UCX peers on this host write with plain
  // stores instead of emulated puts).
  std::string placement;
};

// Called once with the outcome of a batch or a flush (see the contract above).
using Completion = std::function<void(absl::Status)>;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const Capabilities& capabilities() const = 0;

  // Registers `region`, which must stay valid until Deregister or Close returns. Bumps the
  // descriptor version. InvalidArgument for a null base, a zero length, a range past 2^64, CUDA
  // memory without capabilities().gpu_memory, or overlap with a registered region;
  // FailedPrecondition after Close.
  virtual absl::StatusOr<RegionId> Register(const LocalRegion& region) = 0;

  // Allocates `length` bytes of zero-filled host memory where this backend's peers write it
  // fastest, registers it as Register would, and says how another process on this host (the
  // engine that computes into the pages) maps it. Deregister(region) frees it, and so does the
  // transport's end (Close, or at the latest its destruction); a process that mapped it keeps
  // its pages. InvalidArgument for length 0; ResourceExhausted
  // when the memory cannot be had; FailedPrecondition after Close.
  virtual absl::StatusOr<SharedRegion> Allocate(uint64_t length) = 0;

  // Withdraws a registration and bumps the descriptor version. When it returns, the transport
  // and its peers no longer touch the region's bytes: batches still using it as a source fail
  // with kCancelled, and peers' writes into it fail with kUnavailable. NotFound if unknown.
  virtual absl::Status Deregister(RegionId region) = 0;

  // This transport's handshake descriptor: transport kind, one entry per lane, and every
  // registered region with base, length and remote key. `version` rises with every Register
  // and Deregister. `session_id` is left empty for the caller to fill. FailedPrecondition
  // after Close.
  virtual absl::StatusOr<v1::HandshakeDescriptor> LocalDescriptor() const = 0;

  // Connects to the peer that published `peer`. InvalidArgument for a descriptor of another
  // transport kind, with no lanes, or with malformed, zero-length, overflowing or overlapping
  // regions; Unavailable when the peer cannot be reached.
  virtual absl::StatusOr<PeerId> Connect(const v1::HandshakeDescriptor& peer) = 0;

  // Posts `writes` from local region `source` to `peer` on `lane`. The whole batch is checked
  // first ("Bounds before bytes", engine/transport/bounds.h): a lane outside
  // [0, capabilities().lanes), an empty batch, a zero or oversized length, a source range
  // outside `source`, or a destination range not inside one peer region rejects the whole batch
  // with InvalidArgument and nothing is written. NotFound for an unknown peer or region;
  // FailedPrecondition after Close. On OK, `done` reports local completion.
  virtual absl::Status PostWrites(PeerId peer, int lane, RegionId source,
                                  absl::Span<const Write> writes, Completion done) = 0;

  // Calls `done` once every batch posted earlier to `peer` on `lane` has landed at the peer:
  // OK when all batches posted there since the previous Flush of that lane landed, otherwise
  // the first of their failures. Same synchronous errors as PostWrites.
  virtual absl::Status Flush(PeerId peer, int lane, Completion done) = 0;

  // Forgets `peer`: its outstanding batches and flushes complete with kCancelled from the
  // progress context (possibly after Disconnect returns) and its id becomes unknown. NotFound
  // if unknown.
  virtual absl::Status Disconnect(PeerId peer) = 0;

  // Fails every outstanding completion with kCancelled, withdraws every registration (peers'
  // writes into them fail with kUnavailable) and stops the progress context. When it returns,
  // every completion has been called, unless Close was itself called from a completion.
  // Idempotent; every later call but Close fails with FailedPrecondition. The destructor calls
  // it.
  virtual void Close() = 0;

  // Refuses every write that comes from now on over the connections made so far by the writer
  // named `writer` (TransportSpec::writer_name, which its transport tells this one as it
  // connects): none of them lands, and the writer's next flush fails naming the refused write.
  // For a target that found the writer gone: its bytes still in this host's socket buffers, or
  // still on their way from its host's kernel, land nowhere once it gives the pages back.
  // Connections the writer makes later are not refused. Returns how many of the writer's
  // connections so far (one per writer lane) can land nothing more here: those it refused, and
  // (UCX) those that said goodbye after their last write; 0 where capabilities().refuses_writers
  // is false, or where the writer never connected. When it returns, no lane of this transport lands
  // anything more of them. FailedPrecondition after Close.
  virtual absl::StatusOr<size_t> RefuseWriter(std::string_view writer) {
    (void)writer;
    return 0;
  }

  // What the backend did on its own that an operator wants counted. Zero where a backend has
  // no such thing; any thread.
  virtual TransportCounters transport_counters() const { return {}; }
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_TRANSPORT_H_
