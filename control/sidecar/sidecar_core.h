// What both roles' sidecars share (control/sidecar/sidecar.h): the engine API front, the CachePD
// inbox and outbox, the attached arena, the owner thread and its hand-offs, the ticker, metrics
// and the events the engine sees. A sidecar is a PrefillSidecar (prefill_sidecar.h) or a
// DecodeSidecar (decode_sidecar.h): each owns its role's one room ledger (session::PrefillRooms,
// session::DecodeRooms) and what only its role keeps, and fills in the hooks below; nothing here
// asks which role it is. One file per seam:
//   sidecar.cc            Start's checks of the options, and which role's sidecar starts
//   sidecar_core.cc       start and stop, the engine API dispatch, Poll, Stats, and the outputs
//                         both roles share (events, page releases, CachePD sends)
//   arena_attach.cc       AttachArena: the arena and its data-plane registration
//   loops.cc              the CachePD inbox and the ticker's clock
//   prefill_sidecar.cc    a prefill's ledger: peer messages, registrations, the ticker's turn
//                         (timeouts, session probes and drops, registering again), bootstrap
//   prefill_transfers.cc  Ready, Begin and Abort on a prefill: preparing, submitting and
//                         fencing the transfers of a room (its PrefillRooms entry owns them)
//   session_identity.cc   a prefill's check of who answers at a decode session's port
//   decode_sidecar.cc     a decode's ledger: peer messages (sender proofs, digests), the
//                         ticker's turn (timeouts, prefill probes, bootstrap health)
//   decode_routing.cc     Expect and Abort on a decode: bootstrap lookups and routes
//   room_digests.cc       --verify-digest on a decode: the digests prefill ranks sent, and the
//                         check of the landed bytes before a Success counts (the prefill's
//                         side is in prefill_transfers.cc and PrefillSidecar::PrepareSendLocked)
//   arena_staging.cc      a staged arena (a GPU arena the transport cannot reach): the copy
//                         of a prefill room's sources to the mirror, and of a decode's landed
//                         ranges back
//   registry_hooks.cc     --registry: a decode publishes its descriptor, a prefill watches
//
// The owner: one thread owns the room state (the pure state machines and the tables beside
// them): the engine API's (`kvrail-engapi`), which drives `owner` (owner_loop.h, Driven). No
// lock guards the state. The engine API's thread applies engine requests and CachePD peer
// messages in place (it polls the inbox's PULL socket beside its own: ReadInboxLocked); every
// other thread hands it a job, and the room path never waits for one: PostOwned for a room
// prepared in a strand and data-plane outcomes; Owned, which waits for the answer, where
// a rare path needs it (stats from the metrics server, the ticker, a strand's bootstrap lookup,
// the parser of large manifests). The owner never waits on a peer or makes an HTTP request for a
// room. Of engine/ (scheduler, peer directory, transport) it calls one thing: a small room's
// Scheduler::Submit, a bounded enqueue that never waits (prefill_transfers.cc,
// kOwnerSubmitCopies); a warm route's room is prepared on the owner too (PrefillSidecar::
// warm_links). Every other such call is decided and deferred (Defer), and runs once the job is
// done, on the thread that called Owned, or else on `effects` (one post for what the jobs of one
// wake deferred); never on the owner thread. (An AttachArena, applied on the engine API's thread
// like every request, maps and registers the arena and registers with the bootstrap server there:
// before it no room exists.) CachePD pushes are made by the owner: they are non-blocking enqueues
// (ZmqOutbox never waits) whose order per endpoint is the order in which they were decided (a
// registration before its pre-allocations, a pre-allocation before its fence request). What may
// block on one peer (descriptor fetch, connect, copy expansion, a bootstrap lookup) runs in that
// peer's strand of `strands`, so that one dead or slow peer delays only its own rooms. Methods
// named *Locked run on the owner thread: the name is kept from the lock they replaced.
#ifndef KVRAIL_CONTROL_SIDECAR_SIDECAR_CORE_H_
#define KVRAIL_CONTROL_SIDECAR_SIDECAR_CORE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/session/ended_rooms.h"
#include "control/session/peer_log_limiter.h"
#include "control/session/room_output.h"
#include "control/session/transfer_poll.h"
#include "control/session/zmq_channel.h"
#include "control/sidecar/owner_loop.h"
#include "control/sidecar/sidecar.h"
#include "control/sidecar/sidecar_metrics.h"
#include "control/sidecar/strand_pool.h"
#include "engine/memory/arena.h"
#include "engine/memory/arena_staging.h"
#include "engine/memory/cuda_arena.h"
#include "engine/sync/mutex.h"
#include "engine/transport/transport.h"
#include "proto/kvrail/v1/engine.pb.h"

namespace kvrail::sidecar {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address,
                                                          const char* what);

class SidecarCore {
 public:
  SidecarCore(const SidecarOptions& options, const char* role_name);
  virtual ~SidecarCore() = default;
  SidecarCore(const SidecarCore&) = delete;
  SidecarCore& operator=(const SidecarCore&) = delete;

  // Binds every socket, starts the role's data plane and registry, the engine API (which reads
  // the inbox too) and the ticker (sidecar_core.cc). Errors name the option or endpoint at fault.
  absl::Status Start();
  // Sidecar::Stop: everything stopped and joined, in order. Idempotent.
  void Stop();
  // CURVE on: this sidecar's own key is its role's and rank's (KeyRole, KeyRank).
  absl::Status CheckOwnKey() const;
  // The ZAP options of a context whose CURVE servers take keys of `role` (and `rank`, unless
  // -1); `socket` names the socket in refusals.
  zmq_auth::ZapOptions ZapFor(zmq_auth::KeyRole role, int rank, const std::string& socket) const;

  SidecarOptions options;
  const std::string role_name;  // "prefill" or "decode", for logs and Stats
  // GET /metrics (sidecar_metrics.h). First, so that it outlives what counts into it (the
  // scheduler's completions, the peer directory's hooks).
  SidecarMetrics metrics;

  std::shared_ptr<session::ZmqContext> zmq;
  // What peers can make this sidecar log as often as they like goes through this: one line per
  // peer host per 10 s, with a count of those held back. Declared before the inbox, whose
  // watch thread uses it until the inbox closes.
  session::PeerLogLimiter peer_log{std::chrono::seconds(10)};
  std::atomic<uint64_t> connections_cut{0};  // peer connections ZeroMQ cut (inbox_watch.h)
  std::unique_ptr<session::ZmqInbox> inbox;
  std::unique_ptr<session::ZmqOutbox> outbox;
  std::unique_ptr<engine_api::EngineApiServer> api;
  absl::Duration populate_time;  // the allocated arena's PopulatePages, at attach
  // The engine API's thread serves from inside EngineApiServer::Start, before `api` is
  // assigned; its handlers wait here until it is (they read `api`: Stats, Publish).
  Mutex api_mu;
  std::condition_variable api_assigned;
  bool api_ready ABSL_GUARDED_BY(api_mu) = false;
  void WaitForApi() ABSL_LOCKS_EXCLUDED(api_mu) {
    MutexLock lock(&api_mu);
    api_mu.Await(api_assigned,
                 [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(api_mu) { return api_ready; });
  }
  std::unique_ptr<transport::Transport> transport;
  std::string session_id;          // decode: the data-plane session ("host:port")
  std::string cachepd_advertised;  // "tcp://<advertise host>:<CachePD port>"

  // The attached arena: named shared memory, CUDA memory, or memory the transport allocated
  // (AttachArena.allocate_bytes; registered by Allocate, freed by Deregister). Written by
  // Attach under attach_mu before `attached` is set, read-only while attached.
  Mutex attach_mu;
  std::optional<Arena> host_arena;
  std::optional<CudaArena> cuda_arena;
  std::optional<transport::SharedRegion> allocated;
  // A staged arena (SidecarOptions::emulate_gpu_arena, or a CUDA arena the transport cannot
  // reach): the host mirror the data plane reads and writes in its place (region, arena_base
  // and arena_bytes are the mirror's), and what copies between them. Null when not staged.
  std::optional<transport::SharedRegion> mirror;
  std::unique_ptr<ArenaStaging> staging;
  transport::RegionId region = 0;
  uint64_t arena_base = 0;
  uint64_t arena_bytes = 0;
  uint64_t contract_layers = 0;  // the layers the contract's fields name ("layer.<N>.*")
  layout::Contract contract;

  // What a job deferred (Defer), run once it is done (Owned, PostOwned). Owner thread only.
  std::vector<std::function<void()>> deferred;
  bool attached = false;  // owner thread: the role's ledger exists
  SidecarStats stats;

  std::atomic<bool> stop{false};
  std::thread ticker_thread;
  StrandPool strands{4, "kvrail-peer"};
  // Requests with a large manifest, parsed and applied here rather than on the engine API's
  // thread, which meanwhile answers the engine's other requests (TakeSlow). One thread: they
  // are applied in the order they came.
  StrandPool parser{1, "kvrail-parse"};
  // Rooms with requests deferred to `parser`, and how many of each: a later request of such a
  // room follows them there, so that each room's requests apply in the engine's order (a
  // LayersReady with a large manifest before its Ready, an Expect before its Abort). Holds
  // only requests in the parser's queue.
  Mutex deferred_mu;
  std::map<uint64_t, int> deferred_rooms ABSL_GUARDED_BY(deferred_mu);

  // The room state's one owner, driven by the engine API's thread (owner_loop.h, Driven:
  // it applies engine requests in place and runs what others post between them), and the
  // thread that runs what the owner's jobs deferred. Stop stops them in order.
  StrandPool effects{1, "kvrail-effects"};
  OwnerLoop owner{OwnerLoop::Driven{}};

  // Runs `fn` on the owner thread and returns what it returned, then runs what it deferred on
  // this thread. Called from the owner thread itself (a job's own call), runs `fn` at once
  // and leaves what it defers to the job. Once the owner has stopped (Stop), `fn` does not
  // run: the answer is absl::UnavailableError for a Status or StatusOr, a default value
  // otherwise.
  template <typename Fn>
  std::invoke_result_t<Fn&> Owned(Fn fn);
  // Runs `fn` on the owner thread without waiting for it (a data-plane completion); what it
  // deferred runs on `effects`, in order, once the owner has run the jobs it took with it (one
  // post per wake). Dropped once the owner has stopped.
  void PostOwned(std::function<void()> fn);
  // Where room state changes (each *Locked method, Publish): aborts naming `what` when called
  // off the owner thread. Debug builds only (the tests'; -c opt defines NDEBUG).
  void AssertOnOwner(const char* what) const {
#ifndef NDEBUG
    if (!owner.OnOwner()) {
      std::fprintf(stderr, "kvrail: %s ran off the sidecar's owner thread\n", what);
      std::abort();
    }
#else
    (void)what;
#endif
  }
  // The clock of room state: every time a ledger is told, and so every timeout it runs
  // (SidecarOptions::clock; absl::Now() unless a test injects one). Metrics, the scheduler's
  // deadlines and the ticker's pace keep the real clock.
  absl::Time RoomNow() const { return options.clock ? options.clock() : absl::Now(); }
  // In a job: runs `call` once the job is done, off the owner thread.
  void Defer(std::function<void()> call) { deferred.push_back(std::move(call)); }

  // --- sidecar_core.cc: outputs -------------------------------------------------------------
  void Publish(const session::RoomEvent& event);
  void PublishRelease(const session::PagesRelease& release);
  // On the owner, once a job or an engine request is done: posts what it deferred to
  // `effects`.
  void RunDeferredOffOwner();
  // A room's event is counted, and a terminal one ends its entry in the ledger (FreeLocked)
  // before the engine can see it (Publish).
  void FinishLocked(const session::RoomEvent& event);
  // Sends each message (after what the role puts before it: PrepareSendLocked); returns the
  // rooms whose message could not be sent, with why.
  std::vector<std::pair<uint64_t, std::string>> SendLocked(
      const std::vector<session::OutboundMessage>& messages);
  v1::EngineReply Handle(const v1::EngineRequest& request);
  // The engine API's Deferrer: takes a Ready or Expect whose manifest is large to `parser` (and
  // the later requests of its room, which follow it there); the engine API's thread, the
  // owner, applies every other request itself.
  bool TakeSlow(const v1::EngineRequest& request,
                const engine_api::EngineApiServer::Responder& respond);
  SidecarStats Stats();
  void Poll(const v1::Poll& poll, v1::EngineReply& reply);
  void PollLocked(const v1::Poll& poll, v1::EngineReply& reply);
  // On the owner thread, attached: the canonical manifest of an engine's block tables and window,
  // for this arena's contract (CACHEPD §5.2); errors prefixed with `context`.
  absl::StatusOr<layout::Manifest> ManifestFromTables(
      const google::protobuf::RepeatedPtrField<v1::BlockTable>& tables, int64_t prefix_len,
      int64_t prompt_len, const std::string& context) const;

  // --- arena_attach.cc ----------------------------------------------------------------------
  absl::Status Attach(const v1::AttachArena& attach, v1::EngineReply& reply);
  absl::Status ReattachLocked(const v1::AttachArena& attach, v1::EngineReply& reply);
  absl::Status AttachArenaMemory(const v1::AttachArena& attach, const layout::Contract& parsed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu);
  // Needs attach_mu: allocates the host mirror of a staged arena (`bytes` of `unreachable`) on
  // the data plane and the staging between them; returns the mirror, which the data plane uses.
  absl::StatusOr<transport::LocalRegion> MirrorArena(uint8_t* unreachable, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu);
  // Withdraws the arena from the data plane and lets it go (needs attach_mu): after a refused
  // attach, and at Stop, where Deregister frees memory the transport allocated.
  void ReleaseArena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu);

  // --- loops.cc -----------------------------------------------------------------------------
  void ReadInboxLocked();
  // One message the inbox read (or dropped), kept with its sender for HandleInboxMessageLocked.
  struct InboxMessage {
    absl::Status dropped;  // not OK: the inbox dropped it (too many frames), nothing to handle
    std::vector<std::string> frames;
    std::string user_id;  // CURVE on: the sending key's User-Id
    std::string host;     // the sending peer's address; empty if unknown
  };
  // On the owner thread: checks what every message must pass (attached, CURVE binding) and hands
  // it to the role (OnPeerMessageLocked).
  void HandleInboxMessageLocked(InboxMessage& in);
  // On the owner thread. Counts a refused peer message and logs `line` through peer_log.
  void RefuseLocked(const std::string& host, const std::string& line);
  void TickerLoop();
  // Closes the PUSH sockets that no registration (prefill) or prefill node (decode) uses and
  // that sent nothing for a while: the routes of dropped or rejected sessions, kept alive by
  // the Failed frames their fenced rooms sent after the drop.
  void ForgetUnusedRoutes();

  // --- what each role does (PrefillSidecar, DecodeSidecar) ----------------------------------
  // Start: what its options must say beyond what both roles check.
  virtual absl::Status CheckOptions() const = 0;
  // CURVE: the key this sidecar's own must be (role and rank), and the role of its peers' keys.
  virtual zmq_auth::KeyRole KeyRole() const = 0;
  virtual int KeyRank() const = 0;
  virtual std::string KeyRankRule() const = 0;  // how KeyRank comes from the options
  virtual zmq_auth::KeyRole PeerKeyRole() const = 0;
  // Start, once the transport is up: the role's part of the data plane (and its session id).
  virtual absl::Status StartDataPlane() = 0;
  virtual absl::Status StartRegistry() = 0;  // --registry (registry_hooks.cc)
  virtual void StopRegistry() = 0;
  // Stop, once no job defers any more: stops the data plane's own parts (a prefill's scheduler
  // fences what is in flight; a decode's handshake endpoint closes).
  virtual void StopDataPlane() = 0;
  // Attach, under attach_mu: makes the role's ledger for the contract (and sets `attached`),
  // then tells the world the arena is there (a prefill registers with its bootstrap server; a
  // decode publishes its descriptor under --registry).
  virtual absl::Status StartRooms(const v1::AttachArena& attach,
                                  const layout::Contract& parsed) = 0;
  virtual absl::Status AnnounceArena() = 0;
  // An engine attached again: its rooms from before fail with `reason`.
  virtual void VoidRoomsLocked(const std::string& reason) = 0;
  // ReleaseArena, under attach_mu: `attached` is false and the ledger gone (on the owner, in one
  // job), and a prefill's registration with it.
  virtual void ForgetRooms() = 0;
  // Engine requests of one role; the other's refuses them ("... this is a decode sidecar").
  virtual absl::Status Ready(const v1::Ready& ready);
  virtual absl::Status LayersReady(const v1::LayersReady& layers);
  virtual absl::Status Begin(const v1::Begin& begin);
  virtual absl::Status Expect(const v1::Expect& expect);
  virtual void AbortLocked(uint64_t room, const std::string& reason) = 0;
  // Poll: a room's end as its ledger remembers it, or else its state now (nullopt: unknown).
  virtual const session::EndedRoom* EndedLocked(uint64_t room) const = 0;
  virtual std::optional<session::TransferPoll> RoomStateLocked(uint64_t room,
                                                               v1::RoomState& state) const = 0;
  // FinishLocked: a room's terminal event went out; its ledger entry goes.
  virtual void FreeLocked(uint64_t room) = 0;
  // SendLocked: what goes out before `m` on its route (proofs, a digest); false: `m` is not
  // sent at all.
  virtual bool PrepareSendLocked(const session::OutboundMessage& m) = 0;
  // CURVE on: whether the key `user_id` names may send `message` (key_binding.h).
  virtual absl::Status CheckKeyLocked(const std::string& user_id,
                                      const std::vector<std::string>& message) = 0;
  // A peer message past HandleInboxMessageLocked's checks.
  virtual void OnPeerMessageLocked(InboxMessage& in) = 0;
  // The ticker's turn, off the owner thread, every 50 ms: false when no arena is attached.
  // `held`: how long this process was stopped or starved since the last turn (zero unless over
  // 1 s); `beat`: a heartbeat is due (probes, health checks).
  virtual bool Turn(absl::Duration held, bool beat) = 0;
  // ForgetUnusedRoutes, on the owner thread: the PUSH routes the role still uses.
  virtual void LiveRoutesLocked(std::set<std::string>& live) const = 0;
  // Stats: the ledger's sizes (owner thread), and the data plane's (any thread).
  virtual void LedgerStatsLocked(SidecarStats& out) const = 0;
  virtual void DataPlaneStats(SidecarStats& out) const = 0;
};

template <typename Fn>
std::invoke_result_t<Fn&> SidecarCore::Owned(Fn fn) {
  using R = std::invoke_result_t<Fn&>;
  if (owner.OnOwner()) return fn();
  std::vector<std::function<void()>> work;
  // What `fn` defers, not what earlier jobs of the same wake left for `effects`.
  auto take_deferred = [this, &work](size_t before) {
    work.assign(std::make_move_iterator(deferred.begin() + before),
                std::make_move_iterator(deferred.end()));
    deferred.resize(before);
  };
  if constexpr (std::is_void_v<R>) {
    owner.Call([&] {
      const size_t before = deferred.size();
      fn();
      take_deferred(before);
    });
    for (std::function<void()>& call : work) call();
  } else {
    std::optional<R> out = owner.Call([&]() -> R {
      const size_t before = deferred.size();
      R result = fn();
      take_deferred(before);
      return result;
    });
    for (std::function<void()>& call : work) call();
    if (out.has_value()) return *std::move(out);
    if constexpr (std::is_constructible_v<R, absl::Status>) {  // a Status or StatusOr
      return R(absl::UnavailableError("the sidecar is stopping"));
    } else {
      return R{};
    }
  }
}

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_SIDECAR_CORE_H_
