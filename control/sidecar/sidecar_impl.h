// The sidecar's parts, joined (control/sidecar/sidecar.h). One file per seam:
//   sidecar.cc            start and stop, the engine API dispatch, and how the state machines'
//                         outputs are applied (messages, events, fences)
//   arena_attach.cc       AttachArena: the arena, its data-plane registration, the room state
//                         machine, the bootstrap registration (and re-registration)
//   prefill_transfers.cc  Ready and Abort on a prefill: preparing, submitting and fencing the
//                         transfers of a room (its PrefillRooms entry owns their lifecycle)
//   decode_routing.cc     Expect and Abort on a decode: bootstrap lookups and routes
//   loops.cc              the CachePD inbox and the ticker (timeouts, heartbeats, fences)
//   room_digests.cc       --verify-digest on a decode: the digests prefill ranks sent, and the
//                         check of the landed bytes before a Success counts (the prefill's
//                         side is in prefill_transfers.cc and SendLocked)
//   arena_staging.cc      a staged arena (a GPU arena the transport cannot reach): the copy
//                         of a room's sources to the mirror, and of landed ranges back
//
// The owner: one thread owns the room state (the pure state machines and the tables beside
// them): the engine API's (`kvrail-engapi`), which drives `owner` (owner_loop.h, Driven). No
// lock guards the state. The engine API's thread applies engine requests in place; every other
// thread hands it a job, and the room path never waits for one: PostOwned for CachePD batches,
// a prepared room (its submit runs on `effects`) and data-plane outcomes; Owned, which waits
// for the answer, where a rare path needs it (stats from the metrics server, the
// ticker, a strand's bootstrap lookup, the parser of large manifests). The owner never calls into
// engine/ (scheduler, peer directory, transport) or makes an HTTP request for a room: such calls
// are decided and deferred (Defer), and run once the job is done, on the thread that called Owned,
// or else on `effects` (one post for what the jobs of one wake deferred); never on the owner
// thread. (An AttachArena, applied on the engine API's thread like every request, maps and
// registers the arena and registers with the bootstrap server there: before it no room exists.)
// CachePD pushes are made by the owner: they are non-blocking enqueues (ZmqOutbox never waits)
// whose order per endpoint is the order in which they were decided (a registration before its
// pre-allocations, a pre-allocation before its fence request). What may block on one peer
// (descriptor fetch, connect, copy expansion, a bootstrap lookup) runs in that peer's strand of
// `strands`, so that one dead or slow peer delays only its own rooms. Methods named *Locked run on
// the owner thread: the name is kept from the lock they replaced.
#ifndef KVRAIL_CONTROL_SIDECAR_SIDECAR_IMPL_H_
#define KVRAIL_CONTROL_SIDECAR_SIDECAR_IMPL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iterator>
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
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/bootstrap/registration.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/pipeline.h"
#include "control/plan/prefill_description.h"
#include "control/session/decode_rooms.h"
#include "control/session/peer_log_limiter.h"
#include "control/session/prefill_rooms.h"
#include "control/session/zmq_channel.h"
#include "control/sidecar/descriptor_registry.h"
#include "control/sidecar/key_binding.h"
#include "control/sidecar/liveness.h"
#include "control/sidecar/owner_loop.h"
#include "control/sidecar/registration_gate.h"
#include "control/sidecar/sender_check.h"
#include "control/sidecar/session_key.h"
#include "control/sidecar/sidecar.h"
#include "control/sidecar/sidecar_metrics.h"
#include "control/sidecar/staging_holds.h"
#include "control/sidecar/strand_pool.h"
#include "engine/memory/arena.h"
#include "engine/memory/arena_staging.h"
#include "engine/memory/cuda_arena.h"
#include "engine/sync/mutex.h"
#include "engine/transfer/copy_list_pool.h"
#include "engine/transfer/peer_directory.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/handshake/handshake.h"
#include "engine/transport/transport.h"
#include "proto/kvrail/v1/engine.pb.h"

namespace kvrail::sidecar {

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address,
                                                          const char* what);

struct Sidecar::Impl {
  SidecarOptions options;
  std::string role_name;
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
  std::unique_ptr<transport::HandshakeServer> handshake;    // decode
  std::unique_ptr<transport::DescriptorCache> descriptors;  // prefill
  std::unique_ptr<transfer::PeerDirectory> directory;       // prefill
  std::unique_ptr<transfer::Scheduler> scheduler;           // prefill
  // Rooms' copy lists, reused (copy_list_pool.h); shared with the lists' recycle callbacks.
  std::shared_ptr<transfer::CopyListPool> copy_lists =
      std::make_shared<transfer::CopyListPool>();  // prefill
  std::string session_id;
  std::string cachepd_advertised;         // "tcp://<advertise host>:<CachePD port>"
  std::optional<SessionKey> session_key;  // decode: proves its CachePD messages its own

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
  // Prefill: what this rank registers with its bootstrap server (again after it came back).
  std::optional<bootstrap::PrefillRegistration> registration;
  mutable std::atomic<uint64_t> bootstrap_registrations{0};  // accepted, re-registrations too

  // What a job deferred (Defer), run once it is done (Owned, PostOwned). Owner thread only.
  std::vector<std::function<void()>> deferred;
  bool attached = false;
  std::optional<session::PrefillRooms> prefill;
  std::optional<session::DecodeRooms> decode;
  RegistrationGate gate;  // prefill: registrations wait here for their owner's descriptor
  KeyBinding keys;        // CURVE on: which key may send what (key_binding.h)
  std::optional<SenderCheck> senders;  // decode: the sender proofs of prefill nodes
  // Prefill: when each registered session's handshake endpoint last accepted a probe (or was
  // first probed), for --registration-ttl.
  std::map<std::string, absl::Time> session_reached;
  // Prefill: data-plane peers of dropped sessions, for the scheduler to forget once idle.
  std::vector<transport::PeerId> forget_peers;
  // Decode: per bootstrap address, the node's description and planner, and rank endpoints.
  struct PrefillNode {
    plan::PrefillDescription description;
    plan::DecodeTargets targets;  // this decode rank's E_d, Z_d, T_d against the node
    bool kvrail = false;          // its bootstrap server says its ranks prove their messages
    std::map<std::pair<int, int>, std::string> endpoints;  // (dp group, rank) -> tcp://
    // --verify-digest: per prefill rank, where its copies land here (plan::LandingPlan).
    std::map<int, std::shared_ptr<const plan::CopyPlan>> landing_plans;
  };
  std::map<std::string, std::shared_ptr<PrefillNode>> nodes;
  // Decode, staged arena: the rooms whose landed ranges are being copied back to the arena
  // (StageLanded), and the page releases that wait for them (staging_holds.h).
  StagingHolds staging_holds;
  SidecarStats stats;

  // Prefill, CURVE on: the public key of each session's verified owner, which its handshake
  // endpoint must hold (the data plane's descriptor fetches read it off the owner thread).
  Mutex server_keys_mu;
  std::map<std::string, std::string> session_server_keys ABSL_GUARDED_BY(server_keys_mu);
  // CURVE on: the client keys to reach a server holding `public_key`.
  zmq_auth::CurveClientKeys ClientKeys(const std::string& public_key) const {
    return {options.curve->own, public_key};
  }
  // On the owner thread, CURVE on: whether the key `user_id` names may send `message`
  // (key_binding.h); a refused one is logged and counted.
  bool KeyAllowsLocked(const std::string& user_id, const std::vector<std::string>& message,
                       const std::string& host);

  std::atomic<bool> stop{false};
  std::thread inbox_thread;
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
  // thread that runs what the owner's jobs deferred. Sidecar::Stop stops them in order.
  StrandPool effects{1, "kvrail-effects"};
  OwnerLoop owner{OwnerLoop::Driven{}};

  // Runs `fn` on the owner thread and returns what it returned, then runs what it deferred on
  // this thread. Called from the owner thread itself (a job's own call), runs `fn` at once
  // and leaves what it defers to the job. Once the owner has stopped (Sidecar::Stop), `fn`
  // does not run: the answer is absl::UnavailableError for a Status or StatusOr, a default
  // value otherwise.
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
  // In a job: runs `call` once the job is done, off the owner thread.
  void Defer(std::function<void()> call) { deferred.push_back(std::move(call)); }

  // --- sidecar.cc: outputs ------------------------------------------------------------------
  void Publish(const session::RoomEvent& event);
  void PublishRelease(const session::PagesRelease& release);
  // On the owner, once a job or an engine request is done: posts what it deferred to
  // `effects`.
  void RunDeferredOffOwner();
  void FinishLocked(const session::RoomEvent& event);
  std::vector<std::pair<uint64_t, std::string>> SendLocked(
      const std::vector<session::OutboundMessage>& messages);
  // Applies what PrefillRooms asked: messages, cancels (deferred), fences' clocks, events,
  // replaced sessions, transfers to prepare.
  void ApplyLocked(session::PrefillOutput out);
  void ApplyLocked(session::DecodeOutput out);
  v1::EngineReply Handle(const v1::EngineRequest& request);
  // The engine API's Deferrer: takes a Ready or Expect whose manifest is large to `parser` (and
  // the later requests of its room, which follow it there); the engine API's thread, the
  // owner, applies every other request itself.
  bool TakeSlow(const v1::EngineRequest& request,
                const engine_api::EngineApiServer::Responder& respond);
  SidecarStats Stats();
  void Poll(const v1::Poll& poll, v1::EngineReply& reply);
  void PollLocked(const v1::Poll& poll, v1::EngineReply& reply);

  // --- arena_attach.cc ----------------------------------------------------------------------
  absl::Status Attach(const v1::AttachArena& attach, v1::EngineReply& reply);
  absl::Status ReattachLocked(const v1::AttachArena& attach, v1::EngineReply& reply);
  absl::Status AttachArenaMemory(const v1::AttachArena& attach, const layout::Contract& parsed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu);
  absl::Status StartRooms(const v1::AttachArena& attach, const layout::Contract& parsed);
  absl::StatusOr<plan::PipelineLayout> StageLayout(const v1::AttachArena& attach,
                                                   const layout::Contract& parsed) const;
  // Registers this prefill rank with its bootstrap server (HTTP: never on the owner thread).
  absl::Status RegisterWithBootstrap() const;
  // Needs attach_mu: allocates the host mirror of a staged arena (`bytes` of `unreachable`) on
  // the data plane and the staging between them; returns the mirror, which the data plane uses.
  absl::StatusOr<transport::LocalRegion> MirrorArena(uint8_t* unreachable, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu);
  // Withdraws the arena from the data plane and lets it go (needs attach_mu): after a refused
  // attach, and at Stop, where Deregister frees memory the transport allocated.
  void ReleaseArena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(attach_mu);

  // --- prefill_transfers.cc -----------------------------------------------------------------
  absl::Status Ready(const v1::Ready& ready);
  absl::Status LayersReady(const v1::LayersReady& layers);
  // On the owner thread, attached: the canonical manifest of an engine's block tables and window,
  // for this arena's contract (CACHEPD §5.2); errors prefixed with `context`.
  absl::StatusOr<layout::Manifest> ManifestFromTables(
      const google::protobuf::RepeatedPtrField<v1::BlockTable>& tables, int64_t prefix_len,
      int64_t prompt_len, const std::string& context) const;
  // The engine has the request: the room exists from now on, and its Bootstrapped (with the
  // decodes' windows) comes as an event.
  absl::Status Begin(const v1::Begin& begin);
  void AbortPrefill(uint64_t room, const std::string& reason);
  // On the owner thread: refuses a room whose terminal event went out (PrefillRooms::BeginRoom
  // says so: "room N already failed: <reason>"), else
  // begins it (PrefillRooms::BeginRoom) and applies what that says; errors prefixed `context`.
  absl::Status BeginPrefillRoomLocked(uint64_t room, absl::Time now, const std::string& context);
  // A room's transfer may start: prepare each destination in its session's strand.
  void BeginTransferLocked(session::TransferWork work);
  void OnTransferOutcome(const transfer::RoomOutcome& outcome);
  // Forgets what the data plane keeps for `session` (its link, descriptor, and once idle its
  // scheduler queue) and, unless a registration still uses it, the PUSH socket to
  // `reply_endpoint` (empty: keep it). Calls into engine/: never on the owner thread.
  void DropPeer(const std::string& session, const std::string& reply_endpoint);

  // --- decode_routing.cc --------------------------------------------------------------------
  absl::Status Expect(const v1::Expect& expect);
  void AbortDecode(uint64_t room, const std::string& reason);
  absl::StatusOr<std::shared_ptr<PrefillNode>> NodeFor(const std::string& address);
  absl::StatusOr<std::string> EndpointFor(const std::string& address, PrefillNode& node,
                                          int dp_group, int rank);
  // In `address`'s strand: looks the node and its ranks up (HTTP, the first time), then
  // RouteLocked.
  // `dp_group`: the engine's Expect.dp_group, checked against CachePD's rule (plan::DpGroupOf).
  void Route(uint64_t room, const std::string& address, const layout::Manifest& manifest,
             std::optional<int> dp_group);
  // On the owner thread: the room's route when its node and every rank endpoint it needs were
  // looked up already (nothing to fetch), or why the engine's dp_group is refused; nullopt
  // otherwise.
  std::optional<absl::StatusOr<session::RoomRoute>> CachedRouteLocked(uint64_t room,
                                                                      const std::string& address,
                                                                      std::optional<int> dp_group);
  // On the owner thread: routes the room and sends its pre-allocations (or fails it).
  void RouteLocked(uint64_t room, session::RoomRoute route, const layout::Manifest& manifest);

  // --- room_digests.cc ----------------------------------------------------------------------
  // Decode, on the owner thread: keeps a room digest (control/wire/digest.h) for its room's
  // Success.
  void KeepDigestLocked(const std::vector<std::string>& message, const std::string& host);
  // Decode, on the owner thread, --verify-digest: takes a Success that must wait for its digest
  // check (the check runs in a strand, and the Success is handled once it passed), or fails the
  // room whose kvrail prefill rank sent none. False: handle `message` as CachePD does.
  bool TakeForDigestLocked(const std::vector<std::string>& message);
  // Hashes what prefill rank `rank` wrote for `room` here (off the owner thread), compares with
  // `sent`, then handles `success` or fails the room naming both digests.
  void CheckLanded(std::vector<std::string> success, uint64_t room, uint32_t rank, uint64_t sent,
                   std::shared_ptr<const layout::Manifest> manifest,
                   std::shared_ptr<PrefillNode> node);
  // Decode, on the owner thread: a Success from a prefill rank for a room that is live here (what
  // the digest check and staging take); nullopt for any other message.
  struct LiveSuccess {
    uint64_t room = 0;
    uint32_t rank = 0;
    std::string bootstrap_address;
  };
  std::optional<LiveSuccess> LiveSuccessLocked(const std::vector<std::string>& message) const;
  // Decode, on the owner thread: the room's destination manifest and prefill node, which its landed
  // ranges need. When either is no longer known, fails the room ("<what>: the bytes prefill rank N
  // wrote <cannot>: the room's manifest is no longer known here") and returns false.
  bool LandingInputsLocked(const LiveSuccess& success, const std::string& what,
                           const std::string& cannot,
                           std::shared_ptr<const layout::Manifest>& manifest,
                           std::shared_ptr<PrefillNode>& node);
  // Decode: where prefill rank `rank` of `node` lands its copies here (plan::LandingPlan),
  // computed once per node and rank. Asks the owner thread; call it off that thread.
  absl::StatusOr<std::shared_ptr<const plan::CopyPlan>> LandingPlanOf(PrefillNode& node,
                                                                      uint32_t rank);

  // --- arena_staging.cc ---------------------------------------------------------------------
  // On the owner thread: a Success from a prefill rank, checked as far as it must be (sender proof,
  // digest): on a staged decode arena its landed ranges go back to the arena first
  // (TakeForStagingLocked), then the room state machine has it (HandleMessageLocked).
  void DeliverSuccessLocked(const std::vector<std::string>& message, const std::string& host);
  // Decode, on the owner thread, staged arena: takes a Success whose rank's landed ranges must be
  // copied from the mirror to the arena first (in a strand; StageLanded), or fails the room whose
  // ranges cannot be known. False: not a Success of a live room; handle it as CachePD does.
  bool TakeForStagingLocked(const std::vector<std::string>& message);
  // Copies what prefill rank `rank` landed for `room` from the mirror to the arena (off the owner
  // thread), then handles `success`, or fails the room naming the staging error.
  void StageLanded(std::vector<std::string> success, uint64_t room, uint32_t rank,
                   std::shared_ptr<const layout::Manifest> manifest,
                   std::shared_ptr<PrefillNode> node);
  // Prefill, staged arena, off the owner thread: copies the source ranges of `copies` to the
  // mirror, before any write reads them.
  absl::Status StageSources(const plan::CopyList& copies);

  // --- loops.cc -----------------------------------------------------------------------------
  void InboxLoop();
  std::atomic<size_t> inbox_batches_queued{0};  // posted to the owner, not yet begun
  // One message the inbox read (or dropped), kept with its sender for HandleInboxMessageLocked.
  struct InboxMessage {
    absl::Status dropped;  // not OK: the inbox dropped it (too many frames), nothing to handle
    std::vector<std::string> frames;
    std::string user_id;  // CURVE on: the sending key's User-Id
    std::string host;     // the sending peer's address; empty if unknown
  };
  // On the owner thread: checks one message from the inbox (attached, CURVE binding, sender proofs,
  // the registration gate) and hands it to the room state machine.
  void HandleInboxMessageLocked(InboxMessage& in);
  // On the owner thread: hands one CachePD message to the room state machine.
  // `host` sent the message (the inbox's Peer-Address; empty if unknown): refusals are logged
  // at most once per host per 10 s.
  void HandleMessageLocked(const std::vector<std::string>& message, absl::Time now,
                           const std::string& host);
  // On the owner thread. Counts a refused peer message and logs `line` through peer_log.
  void RefuseLocked(const std::string& host, const std::string& line);
  // Decode, on the owner thread: whether `message` (a status or fence answer) must come with a
  // sender proof (SidecarOptions::sender_proofs).
  bool SenderProofRequiredLocked(const std::vector<std::string>& message) const;
  // Checks a registration the gate holds against its session's descriptor, in that session's
  // strand, then lets the gate release what waited (registration_gate.h).
  void VerifyRegistration(RegistrationGate::Check check);
  void TickerLoop();
  void ProbePeers(const std::vector<std::string>& peers);
  // Prefill, off the owner thread: a session whose port accepts connections may still be gone, its
  // port taken by another program or by its own successor. Asks each session that `reach` says
  // listens for its descriptor, all at once, and compares the session key digest with the one
  // its registration was verified with (session_identity.cc). Returns, for each session, why
  // it is gone (empty when it is not), and turns into kUnknown the reach of those that did not
  // answer: silent for --registration-ttl, they are dropped as the unreachable are.
  std::vector<std::string> ConfirmSessions(const std::vector<std::string>& sessions,
                                           std::vector<Reach>& reach);
  // Prefill, on the owner thread: drops `session` (its rooms fail with `reason`) and defers
  // forgetting its data plane. Why a session is dropped: the label of kvrail_sessions_dropped_total
  // and its rooms' cause.
  enum class Drop { kRefused, kOtherProcess, kSilent, kRegistry };
  void DropSessionLocked(const std::string& session, const std::string& reason, Drop why,
                         absl::Time now);
  void ReregisterIfForgotten();
  // Closes the PUSH sockets that no registration (prefill) or prefill node (decode) uses and
  // that sent nothing for a while: the routes of dropped or rejected sessions, kept alive by
  // the Failed frames their fenced rooms sent after the drop.
  void ForgetUnusedRoutes();
  bool bootstrap_answered = true;  // ticker thread only

  // --- registry_hooks.cc: --registry ------------------------------------------------------
  // Last, so that they go first: the watcher's hooks use the parts above.
  // Decode: what the handshake endpoint serves, for the registry too.
  transport::HandshakeServer::Source descriptor_source;
  std::unique_ptr<DescriptorPublisher> registry_publisher;    // decode
  std::unique_ptr<RegistryDescriptors> registry_descriptors;  // prefill
  // Starts the publisher (decode) or the watcher (prefill) when options.registry is set.
  absl::Status StartRegistry();
  // Prefill: `fallback` (null: the plain handshake fetch), asked only for sessions the
  // registry has no descriptor of. Unchanged without --registry or under CURVE.
  transport::DescriptorCache::Fetcher WithRegistry(transport::DescriptorCache::Fetcher fallback);
  // Decode: publishes the descriptor if it changed (never waits for etcd).
  void PublishDescriptor();
  // Revokes the decode's lease (its entry goes at once); stops the prefill's watcher.
  void StopRegistry();
};

template <typename Fn>
std::invoke_result_t<Fn&> Sidecar::Impl::Owned(Fn fn) {
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

#endif  // KVRAIL_CONTROL_SIDECAR_SIDECAR_IMPL_H_
