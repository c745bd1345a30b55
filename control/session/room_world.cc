#include "control/session/room_world.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/session/decode_rooms.h"
#include "control/session/prefill_rooms.h"
#include "control/session/test_transfers.h"
#include "control/wire/fence.h"
#include "control/wire/registration.h"

namespace kvrail::session::testing {
namespace {

using Frames = std::vector<std::string>;

constexpr char kBootstrap[] = "10.0.0.1:8998";
constexpr int64_t kPageTokens = 4;
// Usable pages per rank: ids 1..kPages-1 are lent to rooms; id kPages stands for the engine's
// cached prefix (the slots before prefix_len), which no room is lent.
constexpr int64_t kPages = 48;
constexpr int64_t kPrefixPage = kPages;
constexpr size_t kMaxLiveRequests = 6;
// Every rank's engine hears of a request within this of its creation (one scheduler routes it
// to both deployments), or never: far below every timeout and TTL of ShortTimeouts, as the
// reference's defaults are far above a request's routing time. A rank that first acts on a room
// after its prefill forgot it (failed_room_ttl) makes the room anew, which no bounded memory
// can tell from a new room.
constexpr absl::Duration kFirstCallWithin = absl::Seconds(2);
// Every CachePD message is delivered (or dropped), and every bootstrap lookup answers, within
// this of being sent, as on a live network: the clock never passes it while one waits.
constexpr absl::Duration kLatency = absl::Milliseconds(300);
const absl::Time kStart = absl::UnixEpoch() + absl::Hours(1);

SessionTimeouts ShortTimeouts() {
  SessionTimeouts t;
  t.bootstrap_timeout = absl::Seconds(8);
  t.waiting_timeout = absl::Seconds(10);
  t.heartbeat_interval = absl::Seconds(2);
  t.heartbeat_max_failures = 2;
  t.failed_session_ttl = absl::Seconds(3);
  t.failed_room_ttl = absl::Seconds(6);
  t.unmatched_preallocation_timeout = absl::Seconds(8);
  return t;
}

bool Terminal(TransferPoll state) {
  return state == TransferPoll::kSuccess || state == TransferPoll::kFailed;
}

std::string Describe(const Frames& f) {
  if (wire::IsFenceRequest(f)) return "fence request";
  if (wire::IsFencedAnswer(f)) return "fence answer";
  if (!f.empty() && f[0] == "None") return "registration";
  if (f.size() == 3) return absl::StrCat("pre-allocation of room ", f[0]);
  if (f.size() >= 3) return absl::StrCat("status ", f[1], " of room ", f[0], " from rank ", f[2]);
  return absl::StrCat(f.size(), "-frame message");
}

// Who calls the state machine: the repeat tolerance of kCheckEngineCallsRepeatNoTerminalEvent
// covers engine calls only.
enum class Origin { kEngine, kRoute, kPeer, kTransfer, kTimer, kFault };

enum class DecodeStage { kIdle, kRouting, kLive, kHeld, kEnded, kSkipped };
enum class PrefillStage { kIdle, kBegun, kReady, kAborted, kEnded, kSkipped };

// One request, as both deployments see it: its room and window, and each rank's progress.
struct Request {
  uint64_t room = 0;
  absl::Time created;
  int64_t prefix_len = 0;
  int64_t prompt_len = 0;
  std::vector<DecodeStage> decode;
  std::vector<std::vector<int64_t>> pages;  // per decode rank: the pages its engine lent
  std::vector<layout::Manifest> manifest;   // per decode rank
  std::vector<int> decode_terminal;         // terminal events published, per decode rank
  std::vector<bool> decode_held;            // its terminal event said Pages::kHeld
  std::vector<int> decode_releases;
  std::vector<PrefillStage> prefill;
  std::vector<bool> prefill_began;  // an engine call of the rank began the room
  std::vector<int> prefill_terminal;
};

// What the engine hears, later than the sidecar publishes it.
struct Note {
  enum class Kind { kSuccess, kFailed, kRelease } kind = Kind::kFailed;
  uint64_t room = 0;
  Pages pages = Pages::kUnspecified;
  bool proven = false;
  bool repeat = false;  // a tolerated repeat: the engine ignores it
};

struct DecodeEngine {
  std::vector<int64_t> free;               // a stack: freed pages are lent again first
  std::map<int64_t, uint64_t> lent;        // page -> room
  std::map<int64_t, uint64_t> quarantine;  // released unproven: never lent again
  std::deque<Note> inbox;
};

struct Chunk {
  int decode_rank = 0;
  std::vector<int64_t> pages;
  uint64_t bytes = 0;
};

// A room's work a prefill rank handed out, being prepared (descriptor fetch, connect, copy
// expansion: prefill_transfers.cc), with the writes each destination will get.
struct Preparation {
  int p = 0;
  TransferWork work;
  std::vector<std::string> sessions;       // one transfer each, in this order
  std::vector<std::vector<Chunk>> writes;  // per session
};

// One submitted transfer (one destination of one room): its writes, in flight.
struct Transfer {
  int p = 0;
  uint64_t room = 0;
  std::string session;
  std::vector<Chunk> pending;
  bool failed = false;     // a write failed: it reports that once the rest land or are dropped
  bool cancelled = false;  // PrefillOutput::cancels named it: the rest may not be made
};

struct Sent {
  absl::Time at;
  Frames frames;
};

// A decode's bootstrap lookup of a room's route, in its address's strand (decode_routing.cc).
struct PendingRoute {
  int decode_rank = 0;
  uint64_t room = 0;
  absl::Time at;
};

struct Written {
  uint64_t bytes = 0;
  std::set<int64_t> pages;
};

class World {
 public:
  World(uint64_t seed, bool tracing) : rng_(seed), tracing_(tracing) {}

  WorldResult Run(int steps);

 private:
  // --- setup and randomness ---
  bool Setup();
  uint64_t Uniform(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool Chance(int percent) { return static_cast<int>(Uniform(100)) < percent; }
  void Trace(std::string line) {
    if (!tracing_) return;
    result_.trace.push_back(
        absl::StrCat("t+", absl::FormatDuration(now_ - kStart), " ", std::move(line)));
  }
  void Violate(std::string what) {
    if (!result_.ok) return;
    result_.ok = false;
    result_.violation = std::move(what);
    result_.step = step_;
    Trace(absl::StrCat("VIOLATION: ", result_.violation));
  }
  std::string PrefillEndpoint(int p) const { return absl::StrCat("tcp://10.0.0.1:", 17500 + p); }
  std::string DecodeSession(int d) const { return absl::StrCat("10.1.0.", d + 1, ":", 15000 + d); }
  std::string DecodeReply(int d) const {
    return wire::ReplyEndpoint(absl::StrCat("10.1.0.", d + 1), static_cast<uint16_t>(17000 + d));
  }
  int DecodeOfSession(const std::string& session) const {
    for (int d = 0; d < decode_tp_; ++d) {
      if (DecodeSession(d) == session) return d;
    }
    return -1;
  }
  Request* Find(uint64_t room) {
    auto it = requests_.find(room);
    return it == requests_.end() ? nullptr : &it->second;
  }

  // --- steps; each returns whether it did anything ---
  bool NewRequest();
  bool DecodeEngineStep(bool drain);
  bool RouteStep();
  bool PrefillEngineStep(bool drain);
  bool DeliverStep(bool faults);
  void Deliver(const std::pair<std::string, std::string>& key, bool faults);
  void RouteAt(size_t i);
  // Delivers every message and resolves every route older than kLatency at `until`.
  void Flush(absl::Time until);
  bool DataPlaneStep(bool faults);
  bool InboxStep();
  void ClockStep(absl::Duration by);
  bool FaultStep();

  // --- engine calls, as the sidecar makes them ---
  void Expect(Request& r, int d);
  void Route(uint64_t room, int d);
  void Begin(Request& r, int p);
  void Ready(Request& r, int p);

  // --- applying outputs, as the sidecar does ---
  void Send(const std::string& from, const OutboundMessage& m);
  void ApplyPrefill(int p, PrefillOutput out, Origin origin);
  void ApplyDecode(int d, DecodeOutput out, Origin origin);
  void PublishPrefill(int p, const RoomEvent& event, Origin origin);
  void PublishDecode(int d, const RoomEvent& event, Origin origin);
  void PublishRelease(int d, const PagesRelease& release);
  void BeginTransfer(int p, const TransferWork& work);
  void Prepare(size_t preparation, bool faults);
  void FinishTransfer(const std::pair<int, uint64_t>& key);
  // Whether a write of `room` from prefill rank p may still land (a submitted transfer's), or,
  // with `preparing`, is being prepared (which submits nothing once the room failed).
  bool InFlight(int p, uint64_t room, bool preparing) const;
  void LandChunk(int p, uint64_t room, const Chunk& chunk);

  // --- the engines hearing of it ---
  void DecodeHears(int d, const Note& note);
  void PrefillHears(int p, const Note& note);
  void ReturnPages(int d, Request& r, bool quarantine);

  // --- invariants ---
  void CheckPages();
  // Every state change either ledger made is one its role's table lists (room_transitions.h).
  void CheckMoves();
  void CheckQuiet();
  bool Quiet() const;
  bool RequestOpen(const Request& r) const;

  std::mt19937_64 rng_;
  const bool tracing_;
  int step_ = 0;
  WorldResult result_;
  absl::Time now_ = kStart;
  absl::Time next_heartbeat_ = kStart;
  int prefill_tp_ = 1;
  int decode_tp_ = 1;
  layout::Contract prefill_contract_;
  layout::Contract decode_contract_;
  std::vector<plan::DecodeTargets> targets_;          // per decode rank
  std::vector<std::optional<PrefillRooms>> prefill_;  // nullopt: the rank was killed
  std::vector<DecodeRooms> decode_;
  std::vector<DecodeEngine> decode_engine_;
  std::vector<std::deque<Note>> prefill_inbox_;
  // Per prefill rank: rooms whose Bootstrapped was announced to the engine (its Begin), which
  // must happen once per room.
  std::vector<std::set<uint64_t>> announced_;
  std::map<uint64_t, Request> requests_;
  uint64_t next_room_ = 0;
  // (from, to endpoint) -> frames in order.
  std::map<std::pair<std::string, std::string>, std::deque<Sent>> network_;
  std::vector<PendingRoute> pending_routes_;
  std::vector<Preparation> preparing_;
  std::map<std::pair<int, uint64_t>, Transfer> transfers_;      // (prefill rank, transfer id)
  std::map<std::tuple<int, int, uint64_t>, Written> expected_;  // (p, d, room)
  std::map<std::tuple<int, int, uint64_t>, Written> landed_;    // (p, d, room)
  std::set<std::pair<int, uint64_t>> closed_;    // (d, room): no write of it may land any more
  std::set<std::pair<int, uint64_t>> unproven_;  // (d, room): released unproven
  bool node_healthy_ = true;
  bool node_cached_ = false;  // the decode sidecars know the node's route (no HTTP needed)
  absl::Time heal_at_ = kStart;
  bool killed_one_ = false;
};

// --- setup ------------------------------------------------------------------------------------

bool World::Setup() {
  static constexpr int kPrefillTps[] = {1, 2, 4};
  static constexpr int kDecodeTps[] = {1, 2};
  prefill_tp_ = kPrefillTps[Uniform(3)];
  decode_tp_ = kDecodeTps[Uniform(2)];
  layout::KvShape shape;
  shape.layers = 2;
  shape.kv_heads = 4;
  shape.head_dim = 2;
  shape.dtype = layout::DType::kUint8;
  shape.page_tokens = static_cast<int>(kPageTokens);
  shape.prefix_granularity = kPageTokens;
  shape.pages = kPages;
  if (Chance(25)) {  // MLA-style: replicated, so some prefill ranks are dummies
    shape.latent = true;
    shape.latent_dim = 8;
  }
  absl::StatusOr<layout::Contract> prefill = layout::BuildKvContract(shape, prefill_tp_);
  absl::StatusOr<layout::Contract> decode = layout::BuildKvContract(shape, decode_tp_);
  if (!prefill.ok() || !decode.ok()) {
    Violate(absl::StrCat("setup: contracts: ", prefill.status().ToString(), " ",
                         decode.status().ToString()));
    return false;
  }
  prefill_contract_ = *std::move(prefill);
  decode_contract_ = *std::move(decode);
  absl::StatusOr<plan::Planner> planner =
      plan::Planner::Create(prefill_tp_, decode_tp_, prefill_contract_, decode_contract_);
  if (!planner.ok()) {
    Violate(absl::StrCat("setup: planner: ", planner.status().ToString()));
    return false;
  }
  PrefillOptions prefill_options;
  prefill_options.timeouts = ShortTimeouts();
  // As the sidecar sets them (control/sidecar/sidecar.cc).
  prefill_options.ignore_repeated_preallocations = true;
  prefill_options.unknown_sessions_change_nothing = true;
  for (int p = 0; p < prefill_tp_; ++p) {
    PrefillIdentity identity;
    identity.prefill_tp_size = prefill_tp_;
    identity.prefill_tp_rank = p;
    identity.contract = prefill_contract_;
    absl::StatusOr<PrefillRooms> rooms = PrefillRooms::Create(identity, prefill_options);
    if (!rooms.ok()) {
      Violate(absl::StrCat("setup: prefill ", p, ": ", rooms.status().ToString()));
      return false;
    }
    prefill_.emplace_back(*std::move(rooms));
  }
  DecodeOptions decode_options;
  decode_options.timeouts = ShortTimeouts();
  decode_options.fence_wait = absl::Seconds(4);
  for (int d = 0; d < decode_tp_; ++d) {
    DecodeIdentity identity;
    identity.endpoint = absl::StrCat("10.1.0.", d + 1);
    identity.port = static_cast<uint16_t>(17000 + d);
    identity.session_id = DecodeSession(d);
    identity.arena_base = 0x7e0000000000;
    identity.contract = decode_contract_;
    identity.decode_tp_size = decode_tp_;
    identity.decode_tp_rank = d;
    absl::StatusOr<DecodeRooms> rooms = DecodeRooms::Create(identity, decode_options);
    absl::StatusOr<plan::DecodeTargets> targets = planner->TargetsFor(d);
    if (!rooms.ok() || !targets.ok()) {
      Violate(absl::StrCat("setup: decode ", d, ": ", rooms.status().ToString(), " ",
                           targets.status().ToString()));
      return false;
    }
    decode_.push_back(*std::move(rooms));
    targets_.push_back(*std::move(targets));
    DecodeEngine engine;
    for (int64_t page = kPages - 1; page >= 1; --page) engine.free.push_back(page);
    decode_engine_.push_back(std::move(engine));
  }
  prefill_inbox_.resize(prefill_tp_);
  announced_.resize(prefill_tp_);
  next_room_ = 1 + Uniform(uint64_t{1} << 40);
  result_.prefill_tp = prefill_tp_;
  result_.decode_tp = decode_tp_;
  Trace(absl::StrCat("world: P=", prefill_tp_, " D=", decode_tp_,
                     shape.latent ? " latent" : " k/v heads"));
  return true;
}

// --- the run ----------------------------------------------------------------------------------

WorldResult World::Run(int steps) {
  if (!Setup()) return result_;
  enum Kind {
    kNew,
    kDecodeEngine,
    kRoute,
    kPrefillEngine,
    kDeliver,
    kData,
    kInbox,
    kClock,
    kFault
  };
  static constexpr int kWeights[] = {6, 10, 6, 12, 30, 20, 14, 6, 1};
  int total = 0;
  for (int w : kWeights) total += w;
  for (int step = 0; step < steps && result_.ok; ++step, ++step_) {
    bool done = false;
    for (int attempt = 0; attempt < 20 && !done; ++attempt) {
      int pick = static_cast<int>(Uniform(total));
      int kind = 0;
      while (pick >= kWeights[kind]) pick -= kWeights[kind++];
      switch (kind) {
        case kNew:
          done = NewRequest();
          break;
        case kDecodeEngine:
          done = DecodeEngineStep(false);
          break;
        case kRoute:
          done = RouteStep();
          break;
        case kPrefillEngine:
          done = PrefillEngineStep(false);
          break;
        case kDeliver:
          done = DeliverStep(true);
          break;
        case kData:
          done = DataPlaneStep(true);
          break;
        case kInbox:
          done = InboxStep();
          break;
        case kClock:
          ClockStep(Chance(20) ? absl::Milliseconds(500 + Uniform(3000))
                               : absl::Milliseconds(Uniform(200)));
          done = true;
          break;
        case kFault:
          done = FaultStep();
          break;
      }
    }
    if (!done) ClockStep(absl::Milliseconds(100));
    if (result_.ok) CheckPages();
    if (result_.ok) CheckMoves();
  }
  // Drain: no new rooms and no faults; the engines finish what they began.
  if (result_.ok) Trace("drain");
  node_healthy_ = true;
  for (int i = 0; i < 20000 && result_.ok && !Quiet(); ++i, ++step_) {
    if (!(DecodeEngineStep(true) || RouteStep() || PrefillEngineStep(true) || InboxStep() ||
          DeliverStep(false) || DataPlaneStep(false))) {
      ClockStep(absl::Seconds(1));
    }
    if (result_.ok) CheckPages();
    if (result_.ok) CheckMoves();
  }
  if (result_.ok) CheckQuiet();
  return result_;
}

bool World::RequestOpen(const Request& r) const {
  for (DecodeStage s : r.decode) {
    if (s != DecodeStage::kEnded && s != DecodeStage::kSkipped) return true;
  }
  for (PrefillStage s : r.prefill) {
    if (s != PrefillStage::kEnded && s != PrefillStage::kSkipped && s != PrefillStage::kAborted) {
      return true;
    }
  }
  return false;
}

bool World::Quiet() const {
  for (const auto& [room, r] : requests_) {
    if (RequestOpen(r)) return false;
  }
  for (const auto& [key, queue] : network_) {
    if (!queue.empty()) return false;
  }
  if (!transfers_.empty() || !preparing_.empty() || !pending_routes_.empty()) return false;
  for (const DecodeEngine& e : decode_engine_) {
    if (!e.inbox.empty()) return false;
  }
  for (const auto& inbox : prefill_inbox_) {
    if (!inbox.empty()) return false;
  }
  for (const auto& p : prefill_) {
    if (p.has_value() && p->room_count() > 0) return false;
  }
  for (const DecodeRooms& d : decode_) {
    if (d.room_count() > 0 || d.fence_count() > 0) return false;
  }
  return true;
}

// --- steps ------------------------------------------------------------------------------------

bool World::NewRequest() {
  size_t open = 0;
  for (const auto& [room, r] : requests_) open += RequestOpen(r) ? 1 : 0;
  if (open >= kMaxLiveRequests) return false;
  Request r;
  r.room = next_room_++;
  r.created = now_;
  r.prompt_len = 1 + static_cast<int64_t>(Uniform(40));
  const int64_t max_prefix_pages = (r.prompt_len - 1) / kPageTokens;
  r.prefix_len = Chance(50) ? 0 : kPageTokens * static_cast<int64_t>(Uniform(max_prefix_pages + 1));
  r.decode.assign(decode_tp_, DecodeStage::kIdle);
  r.pages.resize(decode_tp_);
  r.manifest.resize(decode_tp_);
  r.decode_terminal.assign(decode_tp_, 0);
  r.decode_held.assign(decode_tp_, false);
  r.decode_releases.assign(decode_tp_, 0);
  r.prefill.assign(prefill_tp_, PrefillStage::kIdle);
  for (int p = 0; p < prefill_tp_; ++p) {
    if (!prefill_[p].has_value()) r.prefill[p] = PrefillStage::kSkipped;
  }
  r.prefill_began.assign(prefill_tp_, false);
  r.prefill_terminal.assign(prefill_tp_, 0);
  Trace(absl::StrCat("new room ", r.room, " window [", r.prefix_len, ", ", r.prompt_len, ")"));
  requests_.emplace(r.room, std::move(r));
  ++result_.requests;
  return true;
}

bool World::DecodeEngineStep(bool drain) {
  std::vector<std::pair<uint64_t, int>> idle;
  std::vector<std::pair<uint64_t, int>> live;
  for (auto& [room, r] : requests_) {
    for (int d = 0; d < decode_tp_; ++d) {
      if (r.decode[d] == DecodeStage::kIdle && now_ - r.created > kFirstCallWithin) {
        r.decode[d] = DecodeStage::kSkipped;
      }
      if (r.decode[d] == DecodeStage::kIdle) idle.emplace_back(room, d);
      if (r.decode[d] == DecodeStage::kRouting || r.decode[d] == DecodeStage::kLive) {
        live.emplace_back(room, d);
      }
    }
  }
  if (!idle.empty() && (drain || live.empty() || Chance(95))) {
    const auto [room, d] = idle[Uniform(idle.size())];
    Expect(requests_.at(room), d);
    return true;
  }
  if (drain || live.empty() || !Chance(25)) return false;
  const auto [room, d] = live[Uniform(live.size())];
  Trace(absl::StrCat("decode engine ", d, " aborts room ", room));
  ++result_.faults;
  ApplyDecode(d,
              decode_[d].Fail(room, "aborted by the decode engine", now_, FailureCause::kAborted),
              Origin::kEngine);
  return true;
}

void World::Expect(Request& r, int d) {
  DecodeEngine& engine = decode_engine_[d];
  const layout::GroupSpec& spec = decode_contract_.group_specs[0];
  const layout::SlotRange slots = layout::LogicalSlots(spec, r.prefix_len, r.prompt_len);
  if (engine.free.size() < static_cast<size_t>(slots.size())) {
    Trace(absl::StrCat("decode engine ", d, " has no pages for room ", r.room, ": skipped"));
    r.decode[d] = DecodeStage::kSkipped;
    return;
  }
  std::vector<int64_t> table(static_cast<size_t>(slots.end), kPrefixPage);
  for (int64_t slot = slots.begin; slot < slots.end; ++slot) {
    const int64_t page = engine.free.back();
    engine.free.pop_back();
    if (engine.lent.count(page) > 0) {
      Violate(absl::StrCat("decode engine ", d, " page ", page, " is free and lent to room ",
                           engine.lent[page], " at once"));
    }
    engine.lent[page] = r.room;
    table[slot] = page;
    r.pages[d].push_back(page);
  }
  absl::StatusOr<layout::Manifest> manifest = layout::BuildManifest(
      decode_contract_, std::vector<std::vector<int64_t>>{table}, r.prefix_len, r.prompt_len);
  if (!manifest.ok()) {
    Violate(absl::StrCat("decode manifest of room ", r.room, ": ", manifest.status().ToString()));
    return;
  }
  r.manifest[d] = *manifest;
  Trace(absl::StrCat("decode engine ", d, " expects room ", r.room, " in pages {",
                     absl::StrJoin(r.pages[d], ","), "}"));
  absl::StatusOr<DecodeOutput> begun = decode_[d].BeginRoom(r.room, kBootstrap, now_);
  if (!begun.ok()) {
    // A refusal lends nothing: the pages are the engine's still.
    Trace(absl::StrCat("  refused: ", begun.status().message()));
    ReturnPages(d, r, false);
    r.decode[d] = DecodeStage::kSkipped;
    return;
  }
  r.decode[d] = DecodeStage::kRouting;
  ApplyDecode(d, *std::move(begun), Origin::kEngine);
  if (node_cached_ && Chance(70)) {
    Route(r.room, d);  // decode_routing.cc: a node already looked up needs no HTTP
  } else {
    pending_routes_.push_back({d, r.room, now_});
  }
}

bool World::RouteStep() {
  if (pending_routes_.empty()) return false;
  RouteAt(Uniform(pending_routes_.size()));
  return true;
}

void World::RouteAt(size_t i) {
  const PendingRoute route = pending_routes_[i];
  pending_routes_.erase(pending_routes_.begin() + static_cast<std::ptrdiff_t>(i));
  Route(route.room, route.decode_rank);
}

void World::Route(uint64_t room, int d) {
  Request* r = Find(room);
  if (r != nullptr && r->decode[d] == DecodeStage::kRouting) r->decode[d] = DecodeStage::kLive;
  if (!node_cached_ && !node_healthy_) {
    Trace(absl::StrCat("decode ", d, " route of room ", room, ": bootstrap server unreachable"));
    ApplyDecode(d,
                decode_[d].Fail(room, "route: bootstrap server unreachable", now_,
                                FailureCause::kBootstrap),
                Origin::kRoute);
    return;
  }
  node_cached_ = true;
  RoomRoute route;
  route.targets = targets_[d];
  for (int p : route.targets.target_tp_ranks) route.endpoints.push_back({p, PrefillEndpoint(p)});
  Trace(absl::StrCat("decode ", d, " routes room ", room));
  absl::StatusOr<DecodeOutput> out = decode_[d].OnRoute(room, std::move(route), now_);
  if (!out.ok()) {
    ApplyDecode(d, decode_[d].Fail(room, out.status().message(), now_), Origin::kRoute);
    return;
  }
  ApplyDecode(d, *std::move(out), Origin::kRoute);
  if (r == nullptr) return;
  out = decode_[d].OnAllocated(room, r->manifest[d], now_);
  if (!out.ok()) {
    ApplyDecode(d, decode_[d].Fail(room, out.status().message(), now_), Origin::kRoute);
    return;
  }
  ApplyDecode(d, *std::move(out), Origin::kRoute);
}

bool World::PrefillEngineStep(bool drain) {
  std::vector<std::pair<uint64_t, int>> choices;
  for (auto& [room, r] : requests_) {
    for (int p = 0; p < prefill_tp_; ++p) {
      if (r.prefill[p] == PrefillStage::kIdle && now_ - r.created > kFirstCallWithin) {
        r.prefill[p] = PrefillStage::kSkipped;
      }
      const PrefillStage s = r.prefill[p];
      if (s == PrefillStage::kIdle || s == PrefillStage::kBegun ||
          (!drain && s == PrefillStage::kReady)) {
        choices.emplace_back(room, p);
      }
    }
  }
  if (choices.empty()) return false;
  const auto [room, p] = choices[Uniform(choices.size())];
  Request& r = requests_.at(room);
  switch (r.prefill[p]) {
    case PrefillStage::kIdle:
      if (!drain && Chance(3)) {
        Trace(absl::StrCat("prefill engine ", p, " never gets room ", room));
        r.prefill[p] = PrefillStage::kSkipped;
      } else if (Chance(50)) {
        Begin(r, p);
      } else {
        Ready(r, p);
      }
      return true;
    case PrefillStage::kBegun:
      if (!drain && Chance(4)) break;  // aborts below
      Ready(r, p);
      return true;
    case PrefillStage::kReady:
      if (!Chance(2)) return false;
      break;
    default:
      return false;
  }
  Trace(absl::StrCat("prefill engine ", p, " aborts room ", room));
  ++result_.faults;
  r.prefill[p] = PrefillStage::kAborted;
  ApplyPrefill(p, prefill_[p]->Abort(room, "aborted by the prefill engine", now_), Origin::kEngine);
  return true;
}

void World::Begin(Request& r, int p) {
  Trace(absl::StrCat("prefill engine ", p, " begins room ", r.room));
  PrefillRooms& rooms = *prefill_[p];
  absl::StatusOr<PrefillOutput> begun = rooms.BeginRoom(r.room, now_, /*announce=*/true);
  if (!begun.ok()) {
    Trace(absl::StrCat("  refused: ", begun.status().message()));
    return;
  }
  r.prefill[p] = PrefillStage::kBegun;
  r.prefill_began[p] = true;
  ApplyPrefill(p, *std::move(begun), Origin::kEngine);
}

void World::Ready(Request& r, int p) {
  int64_t prefix_len = r.prefix_len;
  int64_t prompt_len = r.prompt_len;
  const bool wrong = Chance(4);
  if (wrong) {
    ++result_.faults;
    if (prefix_len > 0 && Chance(50)) {
      prefix_len -= kPageTokens;
    } else {
      prompt_len += kPageTokens;
    }
  }
  const layout::GroupSpec& spec = prefill_contract_.group_specs[0];
  const layout::SlotRange slots = layout::LogicalSlots(spec, prefix_len, prompt_len);
  std::vector<int64_t> table(static_cast<size_t>(slots.end), kPrefixPage);
  for (int64_t slot = slots.begin; slot < slots.end; ++slot) {
    table[slot] = 1 + static_cast<int64_t>(Uniform(kPages - 1));
  }
  absl::StatusOr<layout::Manifest> source = layout::BuildManifest(
      prefill_contract_, std::vector<std::vector<int64_t>>{table}, prefix_len, prompt_len);
  if (!source.ok()) {
    Violate(absl::StrCat("source manifest of room ", r.room, ": ", source.status().ToString()));
    return;
  }
  Trace(absl::StrCat(
      "prefill engine ", p, " readies room ", r.room,
      wrong ? absl::StrCat(" with the wrong window [", prefix_len, ", ", prompt_len, ")") : ""));
  r.prefill[p] = PrefillStage::kReady;
  // prefill_transfers.cc Ready: BeginRoom, then Ready, each applied.
  PrefillRooms& rooms = *prefill_[p];
  absl::StatusOr<PrefillOutput> begun = rooms.BeginRoom(r.room, now_);
  if (!begun.ok()) {
    Trace(absl::StrCat("  refused: ", begun.status().message()));
    return;
  }
  r.prefill_began[p] = true;
  ApplyPrefill(p, *std::move(begun), Origin::kEngine);
  RoomReady ready;
  ready.source_manifest = *std::move(source);
  ready.bootstrap_token = 1000 + p;
  absl::StatusOr<PrefillOutput> out = prefill_[p]->Ready(r.room, std::move(ready), now_);
  if (!out.ok()) {
    Trace(absl::StrCat("  refused: ", out.status().message()));
    if (wrong) {
      // A Ready refused for its window leaves the room as it was, the engine's to mend or abort
      // (docs/ENGINE-API.md): this engine aborts it, or the room would wait for it for ever.
      Trace(absl::StrCat("prefill engine ", p, " aborts room ", r.room, " after its refusal"));
      r.prefill[p] = PrefillStage::kAborted;
      ApplyPrefill(p, prefill_[p]->Abort(r.room, "aborted by the prefill engine", now_),
                   Origin::kEngine);
    }
    return;
  }
  ApplyPrefill(p, *std::move(out), Origin::kEngine);
}

bool World::DeliverStep(bool faults) {
  std::vector<std::pair<std::string, std::string>> ready;
  for (const auto& [key, queue] : network_) {
    if (!queue.empty()) ready.push_back(key);
  }
  if (ready.empty()) return false;
  Deliver(ready[Uniform(ready.size())], faults);
  return true;
}

void World::Deliver(const std::pair<std::string, std::string>& key, bool faults) {
  std::deque<Sent>& queue = network_[key];
  Frames frames = std::move(queue.front().frames);
  queue.pop_front();
  const std::string what = absl::StrCat(Describe(frames), " ", key.first, " -> ", key.second);
  if (faults && Chance(1)) {
    ++result_.faults;
    Trace(absl::StrCat("drop ", what));
    return;
  }
  const bool preallocation = absl::StartsWith(key.first, "decode") && frames.size() == 3 &&
                             !wire::IsFenceRequest(frames) && frames[0] != "None";
  if (faults && (!preallocation || kReplayPreallocations) && Chance(2)) {
    ++result_.faults;
    Trace(absl::StrCat("duplicate (delivered now and again later) ", what));
    queue.push_back({now_, frames});
  }
  Trace(absl::StrCat("deliver ", what));
  for (int p = 0; p < prefill_tp_; ++p) {
    if (key.second != PrefillEndpoint(p) || !prefill_[p].has_value()) continue;
    PrefillOutput out = prefill_[p]->OnMessage(frames, now_);
    if (!out.rejected.ok()) Trace(absl::StrCat("  rejected: ", out.rejected.message()));
    ApplyPrefill(p, std::move(out), Origin::kPeer);
  }
  for (int d = 0; d < decode_tp_; ++d) {
    if (key.second != DecodeReply(d)) continue;
    DecodeOutput out = decode_[d].OnMessage(frames, now_);
    if (!out.rejected.ok()) Trace(absl::StrCat("  rejected: ", out.rejected.message()));
    ApplyDecode(d, std::move(out), Origin::kPeer);
  }
}

bool World::DataPlaneStep(bool faults) {
  std::vector<std::pair<int, uint64_t>> busy;
  for (const auto& [key, transfer] : transfers_) {
    if (!transfer.pending.empty()) busy.push_back(key);
  }
  if (busy.empty() && preparing_.empty()) return false;
  const size_t pick = Uniform(busy.size() + preparing_.size());
  if (pick >= busy.size()) {
    Prepare(pick - busy.size(), faults);
    return true;
  }
  const std::pair<int, uint64_t> key = busy[pick];
  Transfer& t = transfers_.at(key);
  const size_t i = Uniform(t.pending.size());
  Chunk chunk = t.pending[i];
  t.pending.erase(t.pending.begin() + static_cast<std::ptrdiff_t>(i));
  const std::string what =
      absl::StrCat("write of room ", t.room, " from prefill ", t.p, " to decode ",
                   chunk.decode_rank, " pages {", absl::StrJoin(chunk.pages, ","), "}");
  if (!t.failed && !t.cancelled && faults && Chance(2)) {
    ++result_.faults;
    t.failed = true;
    Trace(absl::StrCat("fail ", what));
  } else if ((t.failed || t.cancelled) && Chance(50)) {
    Trace(absl::StrCat("cancel ", what));
  } else {
    Trace(absl::StrCat("land ", what));
    LandChunk(t.p, t.room, chunk);
  }
  if (t.pending.empty()) FinishTransfer(key);
  return true;
}

void World::Prepare(size_t index, bool faults) {
  Preparation preparation = std::move(preparing_[index]);
  preparing_.erase(preparing_.begin() + static_cast<std::ptrdiff_t>(index));
  const int p = preparation.p;
  const uint64_t room = preparation.work.room;
  if (!prefill_[p].has_value()) return;
  if (faults && Chance(3)) {
    ++result_.faults;
    const std::string session = preparation.sessions.empty() ? "" : preparation.sessions.front();
    Trace(absl::StrCat("prefill ", p, " fails to prepare room ", room, " (", session, ")"));
    ApplyPrefill(
        p,
        prefill_[p]->PreparationFailed(room, preparation.work.generation, "a connect failed",
                                       session, FailureCause::kHandshake, now_),
        Origin::kTransfer);
    return;
  }
  PrefillOutput out;
  const std::vector<uint64_t> ids = prefill_[p]->TransfersPrepared(
      room, preparation.work.generation, preparation.sessions, now_, out);
  Trace(absl::StrCat("prefill ", p, " prepared room ", room, ": ", ids.size(),
                     " transfers submitted"));
  if (!ids.empty() && ids.size() != preparation.sessions.size()) {
    Violate(absl::StrCat("prefill ", p, " room ", room, ": ", ids.size(), " transfer ids for ",
                         preparation.sessions.size(), " destinations"));
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Transfer transfer;
    transfer.p = p;
    transfer.room = room;
    transfer.session = preparation.sessions[i];
    transfer.pending = std::move(preparation.writes[i]);
    transfers_[{p, ids[i]}] = std::move(transfer);
  }
  // Submitted while the room failed (prefill_transfers.cc): its FailingFlag says so.
  const std::shared_ptr<const std::atomic<bool>> failing = prefill_[p]->FailingFlag(room);
  if (!ids.empty() && failing != nullptr && failing->load()) {
    Append(out, prefill_[p]->TransfersSubmitted(room));
  }
  ApplyPrefill(p, std::move(out), Origin::kTransfer);
}

bool World::InFlight(int p, uint64_t room, bool preparing) const {
  for (const Preparation& preparation : preparing_) {
    if (preparing && preparation.p == p && preparation.work.room == room) return true;
  }
  for (const auto& [key, transfer] : transfers_) {
    if (transfer.p == p && transfer.room == room && !transfer.pending.empty()) return true;
  }
  return false;
}

bool World::InboxStep() {
  std::vector<int> ranks;  // decode d as d, prefill p as -1 - p
  for (int d = 0; d < decode_tp_; ++d) {
    if (!decode_engine_[d].inbox.empty()) ranks.push_back(d);
  }
  for (int p = 0; p < prefill_tp_; ++p) {
    if (!prefill_inbox_[p].empty()) ranks.push_back(-1 - p);
  }
  if (ranks.empty()) return false;
  const int rank = ranks[Uniform(ranks.size())];
  if (rank >= 0) {
    Note note = decode_engine_[rank].inbox.front();
    decode_engine_[rank].inbox.pop_front();
    DecodeHears(rank, note);
  } else {
    Note note = prefill_inbox_[-1 - rank].front();
    prefill_inbox_[-1 - rank].pop_front();
    PrefillHears(-1 - rank, note);
  }
  return true;
}

void World::ClockStep(absl::Duration by) {
  // An engine hears its events in milliseconds, well before any timer of the state machines.
  while (result_.ok && InboxStep()) {
  }
  Flush(now_ + by);
  now_ += by;
  Trace(absl::StrCat("clock +", absl::FormatDuration(by)));
  if (!node_healthy_ && now_ >= heal_at_) {
    node_healthy_ = true;
    Trace("prefill node's /health answers again");
  }
  for (int p = 0; p < prefill_tp_; ++p) {
    if (prefill_[p].has_value()) ApplyPrefill(p, prefill_[p]->Tick(now_), Origin::kTimer);
  }
  for (int d = 0; d < decode_tp_; ++d) ApplyDecode(d, decode_[d].Tick(now_), Origin::kTimer);
  if (now_ < next_heartbeat_) return;
  next_heartbeat_ = now_ + ShortTimeouts().heartbeat_interval;
  for (int d = 0; d < decode_tp_; ++d) {
    for (const std::string& address : decode_[d].BootstrapAddresses()) {
      ApplyDecode(d, decode_[d].OnHealth(address, node_healthy_, now_), Origin::kTimer);
    }
    for (const std::string& endpoint : decode_[d].PrefillEndpoints()) {
      for (int p = 0; p < prefill_tp_; ++p) {
        if (endpoint == PrefillEndpoint(p) && !prefill_[p].has_value()) {
          Trace(absl::StrCat("decode ", d, " finds prefill ", p, " gone"));
          ApplyDecode(d, decode_[d].OnPrefillGone(endpoint, now_), Origin::kTimer);
        }
      }
    }
  }
}

void World::Flush(absl::Time until) {
  for (bool again = true; again && result_.ok;) {
    again = false;
    for (size_t i = 0; i < pending_routes_.size(); ++i) {
      if (pending_routes_[i].at + kLatency < until) {
        RouteAt(i);
        again = true;
        break;
      }
    }
    for (const auto& [key, queue] : network_) {
      if (!queue.empty() && queue.front().at + kLatency < until) {
        const auto overdue = key;
        Deliver(overdue, true);
        again = true;
        break;
      }
    }
  }
}

bool World::FaultStep() {
  ++result_.faults;
  switch (Uniform(5)) {
    case 0: {
      const int p = static_cast<int>(Uniform(prefill_tp_));
      if (!prefill_[p].has_value()) return false;
      Trace(absl::StrCat("prefill engine ", p, " restarts"));
      for (auto& [room, r] : requests_) {
        if (r.prefill[p] == PrefillStage::kBegun || r.prefill[p] == PrefillStage::kReady ||
            r.prefill[p] == PrefillStage::kIdle) {
          r.prefill[p] = PrefillStage::kAborted;
        }
      }
      ApplyPrefill(p, prefill_[p]->AbortBegunRooms("the engine restarted", now_), Origin::kFault);
      return true;
    }
    case 1: {
      const int d = static_cast<int>(Uniform(decode_tp_));
      Trace(absl::StrCat("decode engine ", d, " restarts"));
      ApplyDecode(d, decode_[d].FailAll("the engine restarted", now_), Origin::kFault);
      return true;
    }
    case 2:
      if (!node_healthy_) return false;
      node_healthy_ = false;
      heal_at_ = now_ + absl::Milliseconds(1000 + Uniform(8000));
      Trace("prefill node's /health fails");
      return true;
    case 3: {
      const int p = static_cast<int>(Uniform(prefill_tp_));
      const int d = static_cast<int>(Uniform(decode_tp_));
      if (!prefill_[p].has_value()) return false;
      Trace(absl::StrCat("prefill ", p, " drops decode session ", DecodeSession(d)));
      PrefillOutput out;
      (void)prefill_[p]->DropSession(DecodeSession(d), "its registry entry expired", now_, out,
                                     FailureCause::kExpired);
      ApplyPrefill(p, std::move(out), Origin::kFault);
      // The decode registers again at its next room (as after a held sidecar, loops.cc). A
      // decode that does not keeps sending pre-allocations the prefill ignores, and each of its
      // later rooms there waits out its waiting timeout (safe, but no room lands).
      decode_[d].ForgetPeerSets(kBootstrap);
      return true;
    }
    default: {
      if (killed_one_ || prefill_tp_ == 1) return false;
      const int p = static_cast<int>(Uniform(prefill_tp_));
      killed_one_ = true;
      Trace(absl::StrCat("prefill rank ", p, " is killed (kill -9)"));
      prefill_[p].reset();
      prefill_inbox_[p].clear();
      // A process that is gone writes nothing more, and hears nothing.
      for (auto it = transfers_.begin(); it != transfers_.end();) {
        it = it->second.p == p ? transfers_.erase(it) : std::next(it);
      }
      for (auto it = preparing_.begin(); it != preparing_.end();) {
        it = it->p == p ? preparing_.erase(it) : std::next(it);
      }
      for (auto& [key, queue] : network_) {
        if (key.first == absl::StrCat("prefill", p) || key.second == PrefillEndpoint(p)) {
          queue.clear();
        }
      }
      for (auto& [room, r] : requests_) r.prefill[p] = PrefillStage::kSkipped;
      return true;
    }
  }
}

// --- outputs ----------------------------------------------------------------------------------

void World::Send(const std::string& from, const OutboundMessage& m) {
  for (int p = 0; p < prefill_tp_; ++p) {
    // ZeroMQ queues a message for a peer that is gone: nobody ever reads it.
    if (m.endpoint == PrefillEndpoint(p) && !prefill_[p].has_value()) return;
  }
  network_[{from, m.endpoint}].push_back({now_, m.frames});
}

void World::ApplyPrefill(int p, PrefillOutput out, Origin origin) {
  if (!prefill_[p].has_value()) return;
  for (const OutboundMessage& m : out.messages) Send(absl::StrCat("prefill", p), m);
  for (const RoomEvent& event : out.events) {
    // FinishLocked, then Publish (control/sidecar/sidecar.cc).
    if (Terminal(event.state)) prefill_[p]->Free(event.room, now_);
    PublishPrefill(p, event, origin);
  }
  for (const TransferWork& work : out.transfers) BeginTransfer(p, work);
  for (uint64_t room : out.fences) Trace(absl::StrCat("  prefill ", p, " fences room ", room));
  for (uint64_t id : out.cancels) {
    auto found = transfers_.find({p, id});
    if (found == transfers_.end()) continue;  // reported already
    Trace(absl::StrCat("  prefill ", p, " cancels transfer ", id, " of room ", found->second.room));
    found->second.cancelled = true;
  }
}

void World::ApplyDecode(int d, DecodeOutput out, Origin origin) {
  for (const OutboundMessage& m : out.messages) Send(absl::StrCat("decode", d), m);
  for (const RoomEvent& event : out.events) {
    if (Terminal(event.state)) decode_[d].Free(event.room);
    PublishDecode(d, event, origin);
  }
  for (const PagesRelease& release : out.releases) PublishRelease(d, release);
  // This world's prefills fence every transfer proven, so no answer asks a refusal; were one to,
  // the world refuses nothing (its writes are chunks it lands itself), and the release says so.
  for (const std::string& writer : out.refuse_writers) {
    ApplyDecode(d, decode_[d].OnWriterRefused(writer, /*refused=*/false, now_), origin);
  }
  for (const std::string& dead : out.dead_prefills) {
    Trace(absl::StrCat("  decode ", d, " declares prefill node ", dead, " dead"));
    node_cached_ = false;
  }
}

void World::PublishPrefill(int p, const RoomEvent& event, Origin origin) {
  if (!Terminal(event.state)) {
    if (event.announce && !announced_[p].insert(event.room).second) {
      Violate(absl::StrCat("prefill ", p, " announced the Bootstrapped of room ", event.room,
                           " to its engine twice"));
    }
    return;
  }
  announced_[p].erase(event.room);
  Trace(absl::StrCat("  prefill ", p, " publishes ", TransferPollName(event.state), " of room ",
                     event.room, event.reason.empty() ? "" : ": ", event.reason));
  if (InFlight(p, event.room, /*preparing=*/false)) {
    Violate(absl::StrCat("prefill ", p, " published ", TransferPollName(event.state), " of room ",
                         event.room,
                         " while its writes may still land (Failed means fenced, "
                         "Success means landed)"));
    return;
  }
  Request* r = Find(event.room);
  if (r == nullptr) {
    Violate(absl::StrCat("prefill ", p, " published an event of room ", event.room,
                         ", which nobody made"));
    return;
  }
  Note note;
  note.kind = event.state == TransferPoll::kSuccess ? Note::Kind::kSuccess : Note::Kind::kFailed;
  note.room = event.room;
  if (++r->prefill_terminal[p] > 1) {
    if (origin == Origin::kEngine && !kCheckEngineCallsRepeatNoTerminalEvent) {
      ++result_.tolerated_repeats;
      Trace("  (a repeated terminal event, tolerated: kCheckEngineCallsRepeatNoTerminalEvent)");
      note.repeat = true;
    } else {
      Violate(absl::StrCat("prefill ", p, " published terminal event ", r->prefill_terminal[p],
                           " of room ", event.room, " (", TransferPollName(event.state),
                           "): one per room and role"));
      return;
    }
  }
  prefill_inbox_[p].push_back(note);
}

void World::PublishDecode(int d, const RoomEvent& event, Origin origin) {
  if (!Terminal(event.state)) return;
  Trace(absl::StrCat("  decode ", d, " publishes ", TransferPollName(event.state), " of room ",
                     event.room,
                     event.state == TransferPoll::kFailed
                         ? (event.pages == Pages::kHeld ? " (pages held)" : " (pages reusable)")
                         : "",
                     event.reason.empty() ? "" : ": ", event.reason));
  Request* r = Find(event.room);
  if (r == nullptr) {
    Violate(absl::StrCat("decode ", d, " published an event of room ", event.room,
                         ", which nobody made"));
    return;
  }
  Note note;
  note.room = event.room;
  note.pages = event.pages;
  note.kind = event.state == TransferPoll::kSuccess ? Note::Kind::kSuccess : Note::Kind::kFailed;
  if (++r->decode_terminal[d] > 1) {
    if (origin == Origin::kEngine && !kCheckEngineCallsRepeatNoTerminalEvent) {
      ++result_.tolerated_repeats;
      note.repeat = true;
      decode_engine_[d].inbox.push_back(note);
      return;
    }
    Violate(absl::StrCat("decode ", d, " published terminal event ", r->decode_terminal[d],
                         " of room ", event.room, " (", TransferPollName(event.state),
                         "): one per room and role"));
    return;
  }
  if (event.state == TransferPoll::kSuccess) {
    ++result_.decode_successes;
    // Success only with every byte landed: every rank of E_d wrote every page, whole.
    for (int p : targets_[d].expected_prefill_ranks) {
      const auto key = std::make_tuple(p, d, event.room);
      auto expected = expected_.find(key);
      if (expected == expected_.end()) {
        Violate(absl::StrCat("decode ", d, " published Success of room ", event.room,
                             " but prefill ", p, " of E_d never wrote it"));
        return;
      }
      const Written& landed = landed_[key];
      if (landed.bytes != expected->second.bytes || landed.pages != expected->second.pages) {
        Violate(absl::StrCat("decode ", d, " published Success of room ", event.room, " with ",
                             landed.bytes, " of the ", expected->second.bytes, " bytes (",
                             landed.pages.size(), " of ", expected->second.pages.size(),
                             " pages) from prefill ", p, " landed"));
        return;
      }
    }
    closed_.insert({d, event.room});
  } else {
    ++result_.decode_failures;
    if (event.pages == Pages::kHeld) {
      r->decode_held[d] = true;
    } else {
      closed_.insert({d, event.room});
    }
  }
  decode_engine_[d].inbox.push_back(note);
}

void World::PublishRelease(int d, const PagesRelease& release) {
  Trace(absl::StrCat("  decode ", d, " releases the pages of room ", release.room,
                     release.proven ? " (proven)" : " (unproven)", ": ", release.reason));
  ++result_.releases;
  Request* r = Find(release.room);
  if (r == nullptr || !r->decode_held[d] || ++r->decode_releases[d] > 1) {
    Violate(absl::StrCat("decode ", d, " released the pages of room ", release.room,
                         ", which no Failed event said were held, or released them again"));
    return;
  }
  if (release.proven) {
    closed_.insert({d, release.room});
  } else {
    unproven_.insert({d, release.room});
  }
  Note note;
  note.kind = Note::Kind::kRelease;
  note.room = release.room;
  note.proven = release.proven;
  decode_engine_[d].inbox.push_back(note);
}

// --- the data plane ---------------------------------------------------------------------------

void World::BeginTransfer(int p, const TransferWork& work) {
  if (InFlight(p, work.room, /*preparing=*/true)) {
    Violate(absl::StrCat("prefill ", p, " handed out a second transfer of room ", work.room,
                         " while the first is in flight"));
    return;
  }
  Request* r = Find(work.room);
  if (r == nullptr) {
    Violate(absl::StrCat("prefill ", p, " transfers room ", work.room, ", which nobody made"));
    return;
  }
  Preparation preparation;
  preparation.p = p;
  preparation.work = work;
  for (const TransferDestination& destination : work.destinations) {
    const int d = DecodeOfSession(destination.peer->registration.session_id);
    std::vector<int64_t> pages;
    for (const layout::ManifestGroup& g : destination.manifest->groups) {
      pages.insert(pages.end(), g.block_ids.begin(), g.block_ids.end());
    }
    if (d < 0 || pages != r->pages[d]) {
      Violate(absl::StrCat(
          "prefill ", p, " aims room ", work.room, " at pages {", absl::StrJoin(pages, ","),
          "} of ", destination.peer->registration.session_id, ", which lent the room other pages"));
      return;
    }
    plan::CopyList copies;
    absl::Status expanded =
        destination.peer->copy_plan->Expand(*work.source_manifest, *destination.manifest, copies);
    uint64_t bytes = 0;
    for (const plan::Copy& c : copies) bytes += c.length;
    if (!expanded.ok() || bytes != destination.bytes || bytes == 0) {
      Violate(absl::StrCat("prefill ", p, " room ", work.room, " to decode ", d, ": ",
                           destination.bytes, " bytes planned, the copies hold ", bytes, " (",
                           expanded.ToString(), ")"));
      return;
    }
    Written& expected = expected_[{p, d, work.room}];
    expected.bytes = bytes;
    expected.pages = std::set<int64_t>(pages.begin(), pages.end());
    // The destination's writes land in 1 to 3 parts, each whenever the world says.
    const size_t parts = std::min<size_t>(pages.size(), 1 + Uniform(3));
    std::vector<Chunk>& writes = preparation.writes.emplace_back();
    preparation.sessions.push_back(destination.peer->registration.session_id);
    for (size_t i = 0; i < parts; ++i) {
      Chunk chunk;
      chunk.decode_rank = d;
      for (size_t j = i; j < pages.size(); j += parts) chunk.pages.push_back(pages[j]);
      chunk.bytes = bytes / parts + (i + 1 == parts ? bytes % parts : 0);
      writes.push_back(std::move(chunk));
    }
  }
  Trace(absl::StrCat("  prefill ", p, " hands out the transfer of room ", work.room, " (",
                     preparation.sessions.size(), " destinations)"));
  preparing_.push_back(std::move(preparation));
}

void World::LandChunk(int p, uint64_t room, const Chunk& chunk) {
  const int d = chunk.decode_rank;
  ++result_.writes_landed;
  if (closed_.count({d, room}) > 0) {
    Violate(absl::StrCat("a write of room ", room, " from prefill ", p, " landed in decode ", d,
                         " after the room's pages were given back to its engine"));
    return;
  }
  const DecodeEngine& engine = decode_engine_[d];
  for (int64_t page : chunk.pages) {
    auto lent = engine.lent.find(page);
    if (lent != engine.lent.end() && lent->second == room) continue;
    auto quarantined = engine.quarantine.find(page);
    if (quarantined != engine.quarantine.end() && quarantined->second == room) continue;
    Violate(absl::StrCat("a write of room ", room, " from prefill ", p, " landed in decode ", d,
                         " page ", page, ", which is ",
                         lent != engine.lent.end() ? absl::StrCat("lent to room ", lent->second)
                                                   : std::string("free")));
    return;
  }
  Written& landed = landed_[{p, d, room}];
  landed.bytes += chunk.bytes;
  landed.pages.insert(chunk.pages.begin(), chunk.pages.end());
}

void World::FinishTransfer(const std::pair<int, uint64_t>& key) {
  const uint64_t id = key.second;
  auto found = transfers_.find(key);
  if (found == transfers_.end()) return;
  const Transfer t = std::move(found->second);
  transfers_.erase(found);
  if (!prefill_[t.p].has_value()) return;
  // What the scheduler reports (prefill_transfers.cc OnTransferOutcome): a write failure blames
  // the session; a cancel is the room's own doing.
  const absl::Status status = t.failed      ? absl::UnavailableError("a write failed")
                              : t.cancelled ? absl::CancelledError("its room failed")
                                            : absl::OkStatus();
  Trace(absl::StrCat("  prefill ", t.p, " transfer ", id, " of room ", t.room, " to ", t.session,
                     " reports ", status.ok() ? "landed" : status.ToString()));
  ApplyPrefill(t.p, prefill_[t.p]->TransferOutcome(id, status, t.failed ? t.session : "", now_),
               Origin::kTransfer);
}

// --- the engines ------------------------------------------------------------------------------

void World::ReturnPages(int d, Request& r, bool quarantine) {
  DecodeEngine& engine = decode_engine_[d];
  for (int64_t page : r.pages[d]) {
    auto lent = engine.lent.find(page);
    if (lent == engine.lent.end() || lent->second != r.room) {
      Violate(absl::StrCat("decode engine ", d, " frees page ", page, " of room ", r.room,
                           ", which is not lent to it (freed twice?)"));
      return;
    }
    engine.lent.erase(lent);
    if (quarantine) {
      engine.quarantine[page] = r.room;
    } else {
      engine.free.push_back(page);
    }
  }
}

void World::DecodeHears(int d, const Note& note) {
  if (note.repeat) return;
  Request* r = Find(note.room);
  if (r == nullptr) return;
  switch (note.kind) {
    case Note::Kind::kSuccess:
      ReturnPages(d, *r, false);  // used, then given back when the request is done
      r->decode[d] = DecodeStage::kEnded;
      break;
    case Note::Kind::kFailed:
      if (note.pages == Pages::kHeld) {
        r->decode[d] = DecodeStage::kHeld;  // docs/ENGINE-API.md: wait for pages_released
      } else {
        ReturnPages(d, *r, false);
        r->decode[d] = DecodeStage::kEnded;
      }
      break;
    case Note::Kind::kRelease:
      if (r->decode[d] != DecodeStage::kHeld) {
        Violate(absl::StrCat("decode engine ", d, " heard pages_released of room ", note.room,
                             " whose pages it was never told are held"));
        return;
      }
      // Unproven: not provably safe from a late write; this engine never lends them again.
      ReturnPages(d, *r, !note.proven);
      r->decode[d] = DecodeStage::kEnded;
      break;
  }
}

void World::PrefillHears(int p, const Note& note) {
  if (note.repeat) return;
  Request* r = Find(note.room);
  if (r == nullptr || r->prefill[p] == PrefillStage::kSkipped) return;
  r->prefill[p] = PrefillStage::kEnded;
}

// --- invariants -------------------------------------------------------------------------------

void World::CheckMoves() {
  for (size_t p = 0; p < prefill_.size(); ++p) {
    if (prefill_[p].has_value() && prefill_[p]->unlisted_moves() > 0) {
      Violate(
          absl::StrCat("prefill rank ", p, " was asked a state change its table does not list"));
      return;
    }
  }
  for (size_t d = 0; d < decode_.size(); ++d) {
    if (decode_[d].unlisted_moves() > 0) {
      Violate(absl::StrCat("decode rank ", d, " was asked a state change its table does not list"));
      return;
    }
  }
}

void World::CheckPages() {
  for (int d = 0; d < decode_tp_; ++d) {
    const DecodeEngine& engine = decode_engine_[d];
    std::set<int64_t> seen;
    for (int64_t page : engine.free) {
      if (!seen.insert(page).second || engine.lent.count(page) > 0 ||
          engine.quarantine.count(page) > 0) {
        Violate(absl::StrCat("decode engine ", d, " page ", page,
                             " is free twice, or free and lent at once"));
        return;
      }
    }
    if (seen.size() + engine.lent.size() + engine.quarantine.size() != kPages - 1) {
      Violate(absl::StrCat("decode engine ", d, " lost track of a page"));
      return;
    }
  }
}

void World::CheckQuiet() {
  if (!Quiet()) {
    std::vector<std::string> open;
    for (const auto& [room, r] : requests_) {
      if (RequestOpen(r)) open.push_back(absl::StrCat(room));
    }
    for (int p = 0; p < prefill_tp_; ++p) {
      if (prefill_[p].has_value() && prefill_[p]->room_count() > 0) {
        open.push_back(absl::StrCat("prefill ", p, " holds ", prefill_[p]->room_count(), " rooms"));
      }
    }
    for (int d = 0; d < decode_tp_; ++d) {
      if (decode_[d].room_count() + decode_[d].fence_count() > 0) {
        open.push_back(absl::StrCat("decode ", d, " holds ", decode_[d].room_count(), " rooms and ",
                                    decode_[d].fence_count(), " fences"));
      }
    }
    Violate(
        absl::StrCat("the world is not quiet after the drain (rooms not ended, or tables not "
                     "empty): ",
                     absl::StrJoin(open, "; ")));
    return;
  }
  for (const auto& [room, r] : requests_) {
    for (int d = 0; d < decode_tp_; ++d) {
      if (r.decode[d] == DecodeStage::kEnded && r.decode_terminal[d] != 1 &&
          kCheckEngineCallsRepeatNoTerminalEvent) {
        Violate(absl::StrCat("decode ", d, " room ", room, ": ", r.decode_terminal[d],
                             " terminal events"));
        return;
      }
      if (r.decode[d] == DecodeStage::kEnded && r.decode_terminal[d] == 0) {
        Violate(absl::StrCat("decode ", d, " room ", room, " ended without an event"));
        return;
      }
    }
    for (int p = 0; p < prefill_tp_; ++p) {
      if (prefill_[p].has_value() && r.prefill_began[p] && r.prefill_terminal[p] == 0) {
        Violate(absl::StrCat("prefill ", p, " room ", room, " was begun and never ended"));
        return;
      }
    }
  }
  for (int d = 0; d < decode_tp_; ++d) {
    if (!decode_engine_[d].lent.empty()) {
      Violate(absl::StrCat("decode engine ", d, " still lends ", decode_engine_[d].lent.size(),
                           " pages after every room ended"));
      return;
    }
  }
}

}  // namespace

WorldResult RunWorld(uint64_t seed, int steps, bool trace) { return World(seed, trace).Run(steps); }

}  // namespace kvrail::session::testing
