// The kvrail sidecar: one process beside each engine rank, joining the layers (docs/
// ARCHITECTURE.md, "One request, end to end"):
//
//   engine API (control/engine_api) -> room state machines (control/session) -> CachePD frames
//   over ZeroMQ PUSH/PULL, bootstrap HTTP (control/bootstrap), and on the prefill side the data
//   plane: copy plans (control/plan) -> scheduler (engine/transfer) -> UCX (engine/transport),
//   with the decode's descriptor fetched by session id (engine/transport/handshake).
//
// Threads: one owner of the room state (control/sidecar/owner_loop.h), to which the others
// hand work: the engine API server, the CachePD inbox, a ticker (timeouts, heartbeats), strands
// for what may block (bootstrap HTTP, handshake fetches, copy expansion), plus the transport's
// and the scheduler's own (docs/ARCHITECTURE.md, "Threads"). No lock guards room state, and
// nothing slow runs on its owner.
#ifndef KVRAIL_CONTROL_SIDECAR_SIDECAR_H_
#define KVRAIL_CONTROL_SIDECAR_SIDECAR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "control/layout/revision.h"
#include "control/session/timeouts.h"
#include "engine/transport/landing_copy.h"
#include "engine/zmq_auth/curve.h"

namespace kvrail::metrics {
class Registry;
}
namespace kvrail::transport {
class Transport;
}

namespace kvrail::sidecar {

class SidecarCore;

enum class Role { kPrefill, kDecode };

// Decode: from which prefill nodes a status or fence answer must come with a sender proof
// (control/wire/proof.h, docs/SECURITY.md).
enum class SenderProofs {
  kAuto,      // from nodes whose bootstrap server says they are kvrail's (X-Kvrail-Node)
  kRequired,  // from every node: a peer that is not kvrail cannot finish a room
  kOff,       // from none: CachePD's rules alone
};

struct SidecarOptions {
  Role role = Role::kPrefill;
  // The engine API endpoint to bind ("ipc:///tmp/kvrail-p0.sock", "tcp://127.0.0.1:0").
  std::string engine_endpoint;
  // The address this sidecar's CachePD PULL socket and (decode) its data-plane handshake
  // endpoint bind.
  std::string host = "127.0.0.1";
  // The address peers are told to reach it at (its bootstrap registration, its registration
  // frames, a decode's session id and descriptor): empty, `host`, or for a wildcard `host` a
  // real address of this host (control/sidecar/advertise_host.h). Start refuses an address
  // that is not this host's and that it cannot reach itself.
  std::string advertise_host;
  // Prefill: the node's bootstrap server ("host:port") this rank registers with.
  std::string bootstrap;
  // Attention TP of this rank's side; prefill also its DP size (world = tp * dp).
  int tp_size = 1;
  int tp_rank = 0;
  int dp_size = 1;
  int dp_rank = 0;
  // Prefill: pipeline stages of the node and this rank's stage (CACHEPD §10.1). The stage's
  // fields are the engine's `fields_by_stage` (AttachArena), or by default the contract's
  // fields in plan order cut into pp_size runs of whole layers.
  int pp_size = 1;
  int pp_rank = 0;
  // The data plane's backend: "ucx" (the default) or "verbs" (raw libibverbs RC writes,
  // engine/transport/verbs).
  std::string backend = "ucx";
  // UCX: its transport layers ("tcp", "sm") and, for tcp, the interface.
  std::string tls = "tcp";
  std::string net_devices = "lo";
  // How kvrail's own copies store into landing memory (the UCX lanes', a decode's scatter of
  // staged rows), auto, plain or streaming (non-temporal); which is faster depends on the host
  // (engine/transport/landing_copy.h). Verbs takes auto or plain.
  transport::LandingStores landing_stores = transport::LandingStores::kAuto;
  // Verbs: the provider ("libibverbs", or "softverbs", the software provider; empty: the
  // environment variable KVRAIL_VERBS_PROVIDER, else libibverbs), the RDMA devices to use as
  // rails (empty: every active one) and a GID index (-1: chosen).
  std::string verbs_provider;
  std::vector<std::string> rdma_devices;
  int gid_index = -1;
  // Verbs, without rdma_devices: use the NICs nearest this arena: "gpu:<PCI address>" or
  // "numa:<node>" (engine/transport/verbs/rails.h).
  std::string rail_affinity;
  int lanes = 2;
  session::SessionTimeouts timeouts;
  // A room whose copies to all its destinations exceed this fails before anything is sent.
  uint64_t max_room_bytes = 0;
  // A transfer not landed within this fails its room.
  absl::Duration transfer_deadline = absl::Seconds(60);
  // Prefill: the longest a decode's descriptor fetch may take (a peer that does not answer
  // costs this much once; rooms queued behind it then fail at once).
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Prefill: the longest the data plane's Connect waits for a decode's wireup.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Prefill: how long a failed room's writes may take to drain before the peer is disconnected
  // to fence it (transfer::SchedulerOptions::fence_timeout).
  absl::Duration fence_timeout = absl::Seconds(5);
  // Decode: how long a failed room's pages wait for the prefill ranks' fence answers before
  // they are released as not provably safe (session::DecodeOptions::fence_wait).
  absl::Duration fence_wait = absl::Seconds(10);
  // Prefill: a decode session whose handshake endpoint has accepted no connection for this long
  // (a host cut off or gone; a probe every heartbeat interval) is dropped with its rooms, as one
  // whose endpoint refuses connections is at once.
  absl::Duration registration_ttl = absl::Seconds(60);
  SenderProofs sender_proofs = SenderProofs::kAuto;
  // --verify-digest (docs/SECURITY.md, "Digests"): an integrity check of every room's bytes,
  // against bugs and misrouted writes, not attackers. A prefill sends each kvrail decode session
  // the room digest of what it wrote there (control/plan/room_digest.h) right before Success; a
  // decode hashes what landed and fails the room on a mismatch. A decode also fails a room whose
  // Success comes without a digest from a node whose statuses need sender proofs (`sender_proofs`:
  // a kvrail node); other nodes keep CachePD's rule. Refused for CUDA arenas that the data plane
  // registers itself (AttachArena): the digest reads the arena on the host. A staged CUDA arena
  // is hashed in its host mirror (below).
  bool verify_digest = false;
  // The CachePD revision this sidecar speaks (docs/PROTOCOL.md §12.12). nullopt (the default,
  // --cachepd-revision auto): both, each peer answered in the form it sent. Pinned, the sidecar
  // behaves as a peer of that revision alone: it emits only that revision's forms and refuses
  // the other's (a prefill pinned to the snapshot refuses a 2026-09 registration, a decode
  // pinned to it reads exactly 5 status frames). For interop tests and for a deployment that
  // must look like one revision; never needed for kvrail to meet a peer of either revision.
  std::optional<layout::Revision> cachepd_revision;
  // A CUDA arena over a transport that cannot reach GPU memory (Capabilities::gpu_memory false:
  // UCX 1.13 here) is staged through a host mirror of its size that the data plane registers
  // (engine/memory/arena_staging.h): a prefill copies each room's source ranges to the mirror
  // before its writes, a decode copies each prefill rank's landed ranges back to the GPU before
  // that rank's Success counts. Pinned bytes held: staging_chunk_bytes x staging_depth.
  uint64_t staging_chunk_bytes = 4 << 20;
  int staging_depth = 4;
  // For testing the staging path where no GPU is: an engine's shared-memory arena (shm_name) is
  // treated as memory the data plane cannot reach and staged through a mirror with memcpy
  // (engine/memory/host_arena_staging.h), exactly as a CUDA arena would be but for the copies.
  bool emulate_gpu_arena = false;
  // Decode: row staging (issue 31; docs/PROTOCOL.md, "Row staging"): host memory of this many
  // bytes, registered on the data plane and cut into a slot per (room, prefill rank) of a route
  // whose rows land apart in the pages (a head-sliced room of a larger prefill TP): that rank
  // writes the room's rows back to back into the slot, as one run, and this sidecar scatters
  // them into the pages before the rank's Success counts. 0: none offered. Host arenas that the
  // data plane reaches (no arena mirror).
  uint64_t row_staging_bytes = 0;
  // Decode: the routes row staging serves. kAuto: those whose transport places rows landing
  // apart one operation a row (Capabilities::lands_rows_apart_whole false: verbs, UCX where it
  // may choose RDMA) and whose rows are shorter than kRowStagingLongestRow. kAll: every route
  // whose rows land apart (tests, measurement).
  enum class RowStaging { kAuto, kAll };
  RowStaging row_staging = RowStaging::kAuto;
  static constexpr uint64_t kRowStagingLongestRow = 16 << 10;
  // Prefill, for measurement only (`kvrail bench kv --naive`): a room's copies are posted as
  // the planner expands them, one write per row per page per field, never merged, as connectors
  // that write per token row do. The bytes and the checks are the same; only the write count
  // grows. Never the default.
  bool naive_copies = false;
  // Prefill, for measurement only (`kvrail bench kv --compare`): each head-sliced page's rows are
  // posted as one copy per row (merged where contiguous), as before strided copies
  // (docs/decisions/0016-strided-copies.md). Never the default.
  bool no_strided_copies = false;
  // An arena this sidecar allocates (AttachArena.allocate_bytes) has every page made resident
  // at attach (engine/memory/populate.h), so that no room pays the first touch of its pages
  // inside its transfer (measured: docs/benchmarks-history.md, "Variants: naive writes,
  // digests, pages populated at attach"). The attach's log line says what it cost.
  bool populate_arena = true;
  // Prefill: sent as "Authorization: Bearer <token>" with every PUT /route to a bootstrap
  // server started with --bearer-token-file (docs/SECURITY.md). Empty: nothing changes on the wire.
  std::string bootstrap_bearer_token;
  // CURVE on every ZeroMQ socket (docs/SECURITY.md, "Authentication (CURVE)"): this
  // sidecar's own keypair, whose role and rank must be this sidecar's (a prefill's rank is its
  // status rank, pp_rank * tp_size + tp_rank; a decode's its tp_rank), and the keys it
  // accepts. Null: no security, nothing changes on the wire.
  std::shared_ptr<const zmq_auth::CurveKeys> curve;
  // Each connection a ZAP handler refused (peer address, reason), from the handlers' threads;
  // the caller rate-limits its log. Empty: each is logged.
  std::function<void(const std::string& address, const std::string& reason)> on_auth_refusal;
  // The clock of room state (every timeout of the room ledgers: --preallocation-wait,
  // --waiting-timeout, --fence-wait, failed rooms' memory, session ttl), called on the sidecar's
  // threads. Empty: absl::Now(). For tests, which move it to reach a timeout in milliseconds;
  // the ticker still turns every 50 ms of real time. Not a flag.
  std::function<absl::Time()> clock;
  // For tests: wraps the data plane the sidecar made (--backend) before anything uses it, e.g. in
  // the fault-injecting transport (engine/transport/fault). Empty: the backend itself. Not a
  // flag.
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>
      wrap_transport;
  // For tests: every control-plane message this sidecar sends passes through this first
  // (session::OutboxOptions::intercept): it may change the frames (a peer that holds the right
  // keys and lies), or return false to withhold the message (an answer a peer of another version
  // never gives). Empty: every message is sent as it is. Not a flag.
  std::function<bool(std::vector<std::string>& frames)> intercept_message;
  // Prefill: the most rooms tracked at once (PrefillOptions::max_rooms).
  size_t max_rooms = 65536;
  // Prefill: the most rooms one decode session may hold pre-allocations in at once
  // (PrefillOptions::max_rooms_per_session), so that one decode cannot fill max_rooms.
  size_t max_rooms_per_session = 8192;
  // Prefill: the most decode sessions registered at once (PrefillOptions::max_registrations).
  size_t max_registrations = 4096;
  // Terminal room states kept for Poll after their event was published.
  size_t remembered_rooms = 65536;
  // --registry etcd://host:port (README, "etcd registry"; empty: off, nothing changes): a
  // decode publishes its data-plane descriptor there under a lease of `registry_ttl` it keeps
  // alive; a prefill looks descriptors up there before the handshake and drops a session whose
  // entry is deleted (its lease expired). etcd down at start is a start error.
  std::string registry;
  absl::Duration registry_ttl = absl::Seconds(10);
};

struct SidecarStats {
  uint64_t rooms_succeeded = 0;
  uint64_t rooms_failed = 0;
  uint64_t peer_messages = 0;
  uint64_t peer_messages_rejected = 0;
  uint64_t bytes_sent = 0;      // prefill: bytes landed at decode ranks
  uint64_t pages_unproven = 0;  // decode: rooms whose pages were released without every fence
  uint64_t bootstrap_registrations = 0;  // prefill: accepted PUT /route, re-registrations too
  // Table sizes now ("nothing grows without bound"): rooms tracked by the state machine,
  // decode registrations held (prefill), rooms whose pages wait for fences (decode), prefill
  // rooms with a transfer being prepared or in flight, terminal rooms remembered for Poll,
  // CachePD peers with an open PUSH socket, data-plane peers connected, transfers in the
  // scheduler, peers with work queued in a strand.
  uint64_t rooms = 0;
  uint64_t registrations = 0;
  uint64_t fences = 0;
  uint64_t transfers = 0;
  uint64_t finished_remembered = 0;
  // Prefill: failed rooms freed and kept for their TTL (CACHEPD §11.2); not in `rooms`.
  uint64_t failed_rooms_remembered = 0;
  uint64_t outbox_peers = 0;
  uint64_t data_plane_peers = 0;
  // The data plane's endpoints now (one per connected peer and lane: a UCX endpoint, a verbs
  // QP; a decode opens none, its prefills' endpoints reach it) and the local memory regions it
  // holds registered (the arena, or a staged arena's host mirror), as its descriptor lists them.
  uint64_t endpoints = 0;
  uint64_t regions = 0;
  uint64_t scheduler_transfers = 0;
  uint64_t scheduler_peers = 0;
  uint64_t strands = 0;
  uint64_t engines = 0;  // engines connected to the engine API
  // Prefill: registrations refused by their session's descriptor (registration_gate.h), and
  // messages waiting for a registration's verification now.
  uint64_t registrations_refused = 0;
  uint64_t registrations_held = 0;
  // --verify-digest. Prefill: room digests sent. Decode: Successes whose digest matched the
  // landed bytes, and rooms failed because it did not (or none came from a kvrail node).
  uint64_t room_digests = 0;
  uint64_t room_digests_failed = 0;
  // Decode, row staging (--row-staging-bytes): prefill ranks' staged rows scattered into the
  // pages; offers not made for want of a free slot (those rooms were written in place); slots
  // kept out of use because their room's fence was not proven.
  uint64_t rows_scattered = 0;
  uint64_t row_staging_full = 0;
  uint64_t row_staging_quarantined = 0;
  uint64_t rail_failovers = 0;  // transport::TransportCounters, as the next four
  uint64_t lane_wakes_by_event = 0;
  uint64_t lane_wakes_by_job = 0;
  uint64_t lane_naps_ended = 0;
  uint64_t writes_stored_together = 0;
  // The attached arena's bytes and the layers its contract's fields name (0 before AttachArena).
  uint64_t arena_bytes = 0;
  uint64_t layers = 0;
};

class Sidecar {
 public:
  // Binds every socket and starts serving; the engine attaches its arena next (AttachArena:
  // its own shared memory or CUDA memory, or allocate_bytes for an arena this sidecar's
  // transport allocates where peers write it fastest). Errors name the option or endpoint at
  // fault.
  static absl::StatusOr<std::unique_ptr<Sidecar>> Start(const SidecarOptions& options);
  ~Sidecar();  // Stop()

  // Stops serving, cancels transfers in flight, withdraws the arena from the data plane (and
  // frees it if this sidecar allocated it; an engine's mapping keeps its pages) and joins every
  // thread. Idempotent.
  void Stop();

  const std::string& engine_endpoint() const;
  // "tcp://host:port" of the CachePD PULL socket as peers are told to reach it: the advertised
  // host (SidecarOptions::advertise_host), which differs from the bound one for a wildcard
  // `host`.
  const std::string& cachepd_endpoint() const;
  // Decode: the data-plane session id ("host:port") peers fetch the descriptor from.
  const std::string& session_id() const;
  SidecarStats stats() const;
  // What GET /metrics serves (control/sidecar/sidecar_metrics.h): thread-safe, for the life of
  // the sidecar.
  const metrics::Registry& metrics() const;

 private:
  explicit Sidecar(std::unique_ptr<SidecarCore> core);
  // A PrefillSidecar or a DecodeSidecar (sidecar_core.h).
  std::unique_ptr<SidecarCore> core_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_SIDECAR_H_
