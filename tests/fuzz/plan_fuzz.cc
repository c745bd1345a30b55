// Fuzz harness: registration -> plan -> resolve (CACHEPD §3.2, §3.3, §6, §6.9) on a prefill
// rank, with fixed contracts and fuzzed registration fields and manifests.
//
// Input (text): line 1 "<case> <P> <p> <D> <d> <arena base> <mode>" in decimal, where <case>
// picks one of kPlanCases (planner_cases.h) and missing or unreadable numbers take the case's
// own P and D, rank 0, base 0x7e0000000000 and mode 0; line 2 the room's source manifest wire;
// the rest its destination manifest wire. <case> counts kPlanCases, then kShardedPlanCases
// (page-sharded prefill groups, CACHEPD §12.8: virtual source ids, owner filters).
// Bit 2 of <mode> puts the prefill rank in a two-stage pipeline (§12.6): stage 0 holds the
// first half of the prefill contract's fields in plan order, stage 1 the rest; bit 3 picks
// stage 1. The rank then plans with its stage's filter.
//
// Every input: prefill rank p of P decides decode rank d of D's registration as
// session::PrefillRooms does (Planner::Create, OnRegistration, CopyPlan::Bind: built once per
// case and sizes, as the rooms layer caches them), and the bound plan expands the raw
// manifests, whatever they hold, as the sidecar expands a room (copy_bounds.h): its own checks
// are the last line before bytes, and every copy must lie inside the prefill's arena
// [0, ArenaBytes) and the decode's. Manifests that pass §5.3 on their sides and pair (the
// same prompt window and block counts) must expand.
//
// With <mode> odd, the registration goes through the rooms layer too, frames and all: decode
// rank d's registration (wire::BuildRegistration with D, d, the base and the case's decode
// contract) is sent to a PrefillRooms, which parses, plans and binds it as a real one; the rest
// of the rank's fan-out S_p registers the same way; each pre-allocates room 1 with the
// destination manifest; the engine begins the room and makes it ready with the source manifest
// (before the pre-allocations when bit 1 of <mode> is set); every transfer handed over is
// expanded and checked against the registered base: [base, base + ArenaBytes), and the bytes
// the rooms layer planned.
//
// Properties: no crash, leak or undefined behaviour, and the ones above; and every route the
// planner makes writes each byte range once per block (ValidateOwnerCoverage: one sender, or
// for a sharded group the owners 0..k-1 once each).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/planner.h"
#include "control/plan/stage_filter.h"
#include "control/session/prefill_rooms.h"
#include "control/wire/preallocation.h"
#include "control/wire/registration.h"
#include "tests/fuzz/check.h"
#include "tests/fuzz/copy_bounds.h"
#include "tests/fuzz/planner_cases.h"

namespace {

using kvrail::fuzz::Check;
using kvrail::fuzz::PlannerCase;
namespace layout = kvrail::layout;
namespace plan = kvrail::plan;
namespace session = kvrail::session;
namespace wire = kvrail::wire;

constexpr uint64_t kRoom = 1;

const std::vector<PlannerCase>& Cases() {
  static const auto* const cases = [] {
    auto* loaded = new std::vector<PlannerCase>;
    for (const char* name : kvrail::fuzz::kPlanCases)
      loaded->push_back(kvrail::fuzz::LoadPlannerCase(name));
    for (const kvrail::fuzz::ShardedPlanCase& sharded : kvrail::fuzz::kShardedPlanCases)
      loaded->push_back(kvrail::fuzz::LoadShardedPlannerCase(sharded));
    return loaded;
  }();
  return *cases;
}

struct Header {
  const PlannerCase* contracts = nullptr;
  int64_t prefill_tp_size = 1;
  int64_t prefill_tp_rank = 0;
  int64_t decode_tp_size = 1;
  int64_t decode_tp_rank = 0;
  uint64_t arena_base = 0x7e0000000000;
  bool through_rooms = false;
  bool ready_first = false;
  int stage = -1;  // -1: one stage holding every field; else 0 or 1 of two (§12.6)
};

// The fields stage `stage` of the two-stage placement holds: the first or second half of the
// prefill contract's fields in plan order.
plan::StageFilter StageOf(const layout::Contract& prefill, int stage) {
  plan::StageFilter filter;
  const size_t n = prefill.plan.fields.size();
  for (size_t i = 0; i < n; ++i) {
    if ((i < (n + 1) / 2) == (stage == 0))
      filter.field_ids.push_back(prefill.plan.fields[i].field_id);
  }
  return filter;
}

Header ReadHeader(absl::string_view line) {
  std::vector<absl::string_view> words =
      absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
  words.resize(7);
  Header h;
  uint64_t index = 0;
  if (!absl::SimpleAtoi(words[0], &index)) index = 0;
  h.contracts = &Cases()[index % Cases().size()];
  h.prefill_tp_size = h.contracts->prefill_tp_size;
  h.decode_tp_size = h.contracts->decode_tp_size;
  (void)absl::SimpleAtoi(words[1], &h.prefill_tp_size);
  (void)absl::SimpleAtoi(words[2], &h.prefill_tp_rank);
  (void)absl::SimpleAtoi(words[3], &h.decode_tp_size);
  (void)absl::SimpleAtoi(words[4], &h.decode_tp_rank);
  (void)absl::SimpleAtoi(words[5], &h.arena_base);
  uint64_t mode = 0;
  (void)absl::SimpleAtoi(words[6], &mode);
  h.through_rooms = (mode & 1) != 0;
  h.ready_first = (mode & 2) != 0;
  if ((mode & 4) != 0) h.stage = (mode & 8) != 0 ? 1 : 0;
  return h;
}

bool InInt(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

std::string SessionOf(uint32_t decode_rank) {
  return absl::StrCat("10.0.0.2:", 20000 + decode_rank);
}

// Decode rank `rank` registers; returns its stored registration, or null when it was refused.
std::shared_ptr<const session::DecodePeer> Register(session::PrefillRooms& rooms, const Header& h,
                                                    uint32_t rank,
                                                    std::vector<session::TransferWork>& transfers,
                                                    absl::Time now) {
  wire::Registration r;
  r.endpoint = "10.0.0.2";
  r.port = static_cast<uint16_t>(17000 + rank % 1024);
  r.session_id = SessionOf(rank);
  r.arena_base = h.arena_base;
  r.contract_wire = h.contracts->decode_wire;
  r.decode_tp_size = static_cast<uint32_t>(h.decode_tp_size);
  r.decode_tp_rank = rank;
  absl::StatusOr<std::vector<std::string>> frames = wire::BuildRegistration(r);
  if (!frames.ok()) return nullptr;  // fields no registration can carry (a zero base, say)
  session::PrefillOutput out = rooms.OnMessage(*frames, now);
  for (session::TransferWork& w : out.transfers) transfers.push_back(std::move(w));
  if (!out.rejected.ok()) return nullptr;
  return rooms.Registration(r.session_id);
}

void BeginAndReady(session::PrefillRooms& rooms, std::optional<layout::Manifest> source,
                   std::vector<session::TransferWork>& transfers, absl::Time now) {
  // A room a refused pre-allocation already ended (a Failed state) is refused, naming that end
  // (docs/ENGINE-API.md, "What the engine can trust"); a room with no end yet begins.
  const std::optional<session::TransferPoll> before = rooms.State(kRoom);
  const bool ended =
      before == session::TransferPoll::kFailed || before == session::TransferPoll::kSuccess;
  absl::StatusOr<session::PrefillOutput> begun = rooms.BeginRoom(kRoom, now);
  Check(begun.ok() == !ended, ended ? "BeginRoom began a room that had already ended"
                                    : "BeginRoom refused room 1, which had not ended");
  if (ended) return;
  session::RoomReady ready;
  ready.source_manifest = std::move(source);
  ready.bootstrap_token = 5;
  absl::StatusOr<session::PrefillOutput> out = rooms.Ready(kRoom, std::move(ready), now);
  // The first Ready of a begun room is refused only for what it says: a source manifest that
  // breaks §5.3 or whose window contradicts the decode's (an InvalidArgument naming it).
  Check(out.ok() || absl::IsInvalidArgument(out.status()), [&] {
    return absl::StrCat("the first Ready of a begun room was refused: ", out.status().ToString());
  });
  if (!out.ok()) return;
  for (session::TransferWork& w : out->transfers) transfers.push_back(std::move(w));
}

// What the rooms layer decides for decode rank d's registration on prefill rank p
// (PrefillRooms::Admit): the copy plan of a data registration, none for a dummy or a refusal.
struct Decision {
  bool accepted = false;
  std::optional<plan::CopyPlan> copy_plan;
};

const Decision& Decide(const Header& h) {
  using PlannerKey = std::tuple<const PlannerCase*, int, int, int>;
  using Key = std::tuple<const PlannerCase*, int, int, int, int, int>;
  static auto* const planners = new std::map<PlannerKey, absl::StatusOr<plan::Planner>>;
  static auto* const decisions = new std::map<Key, Decision>;
  const int P = static_cast<int>(h.prefill_tp_size);
  const int p = static_cast<int>(h.prefill_tp_rank);
  const int D = static_cast<int>(h.decode_tp_size);
  const int d = static_cast<int>(h.decode_tp_rank);
  const Key key{h.contracts, P, p, D, d, h.stage};
  if (auto found = decisions->find(key); found != decisions->end()) return found->second;
  if (planners->size() > 1024) planners->clear();  // the fuzzer tries many sizes
  if (decisions->size() > 4096) decisions->clear();
  auto planner = planners->find({h.contracts, P, D, h.stage});
  if (planner == planners->end()) {
    const std::optional<plan::StageFilter> stage =
        h.stage < 0 ? std::nullopt : std::optional(StageOf(h.contracts->prefill, h.stage));
    planner = planners
                  ->emplace(PlannerKey{h.contracts, P, D, h.stage},
                            plan::Planner::Create(P, D, h.contracts->prefill, h.contracts->decode,
                                                  stage ? &*stage : nullptr))
                  .first;
  }
  Decision decision;
  if (planner->second.ok()) {
    absl::StatusOr<plan::Route> route = planner->second->PlanForDecodeRank(d);
    if (route.ok()) {
      const absl::Status covered =
          plan::ValidateOwnerCoverage(plan::RangeSendersOf(*route), h.contracts->prefill);
      Check(covered.ok(), [&] {
        return absl::StrCat("decode rank ", d,
                            "'s route does not write each block once: ", covered.ToString());
      });
    }
    plan::RegistrationOutcome outcome = planner->second->OnRegistration(p, d);
    if (outcome.kind == plan::RegistrationOutcome::Kind::kDummy) decision.accepted = true;
    if (outcome.kind == plan::RegistrationOutcome::Kind::kSend) {
      absl::StatusOr<plan::CopyPlan> bound = plan::CopyPlan::Bind(
          h.contracts->prefill, h.contracts->decode, outcome.fragments, outcome.owner_filters);
      decision.accepted = bound.ok();
      if (bound.ok()) decision.copy_plan = *std::move(bound);
    }
  }
  return decisions->emplace(key, std::move(decision)).first->second;
}

// The rooms layer's pairing rule (CACHEPD §6.9): one prompt window, and as many blocks per group.
bool Paired(const layout::Manifest& a, const layout::Manifest& b) {
  if (a.prefix_len != b.prefix_len || a.prompt_len != b.prompt_len) return false;
  if (a.groups.size() != b.groups.size()) return false;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    if (a.groups[g].group_id != b.groups[g].group_id ||
        a.groups[g].block_ids.size() != b.groups[g].block_ids.size()) {
      return false;
    }
  }
  return true;
}

void FuzzPlan(const Header& h, const layout::Manifest& source,
              const layout::Manifest& destination) {
  const Decision& decision = Decide(h);
  if (!decision.copy_plan) return;
  kvrail::CopyList copies;
  const absl::Status expanded = kvrail::fuzz::ExpandAndCheck(
      *decision.copy_plan, source, destination,
      static_cast<uint64_t>(h.contracts->prefill.ArenaBytes()), /*destination_base=*/0,
      static_cast<uint64_t>(h.contracts->decode.ArenaBytes()), copies);
  const bool valid = layout::ValidateManifest(source, h.contracts->prefill).ok() &&
                     layout::ValidateManifest(destination, h.contracts->decode).ok() &&
                     Paired(source, destination);
  Check(!valid || expanded.ok(), [&] {
    return absl::StrCat("manifests that pass §5.3 and pair do not expand: ", expanded.ToString());
  });
}

// The same registration through the rooms layer, frames and all (mode bit 0).
void FuzzRooms(const Header& h, const std::optional<layout::Manifest>& source,
               absl::string_view destination_wire) {
  session::PrefillIdentity identity;
  identity.prefill_tp_size = static_cast<int>(h.prefill_tp_size);
  identity.prefill_tp_rank = static_cast<int>(h.prefill_tp_rank);
  identity.contract = h.contracts->prefill;
  if (h.stage >= 0) identity.stage = StageOf(h.contracts->prefill, h.stage);
  absl::StatusOr<session::PrefillRooms> rooms = session::PrefillRooms::Create(identity);
  if (!rooms.ok()) return;
  const absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<session::TransferWork> transfers;

  const uint32_t d = static_cast<uint32_t>(h.decode_tp_rank);
  std::shared_ptr<const session::DecodePeer> peer = Register(*rooms, h, d, transfers, now);
  if (peer == nullptr) return;

  Check(Decide(h).accepted, "the rooms layer accepts a registration the planner path refuses");

  // The rest of the fan-out registers too; every rank of S_p is one the planner sends to.
  const std::vector<int> fan_out = peer->expected_decode_ranks;
  bool in_fan_out = false;
  for (int rank : fan_out) {
    if (static_cast<uint32_t>(rank) == d) {
      in_fan_out = true;
      continue;
    }
    Check(Register(*rooms, h, static_cast<uint32_t>(rank), transfers, now) != nullptr, [&] {
      return absl::StrCat("decode rank ", rank, " of the fan-out of prefill rank ",
                          h.prefill_tp_rank, " was refused");
    });
  }
  Check(in_fan_out, "an accepted decode rank is not in its prefill rank's fan-out");

  if (h.ready_first) BeginAndReady(*rooms, source, transfers, now);
  for (int rank : fan_out) {
    wire::Preallocation p;
    p.room = kRoom;
    p.session_id = SessionOf(static_cast<uint32_t>(rank));
    if (!rooms->Registration(p.session_id)->dummy) p.manifest_wire = std::string(destination_wire);
    absl::StatusOr<std::vector<std::string>> frames = wire::BuildPreallocation(p);
    if (!frames.ok()) return;  // a manifest no frame can carry
    session::PrefillOutput out = rooms->OnMessage(*frames, now);
    for (session::TransferWork& w : out.transfers) transfers.push_back(std::move(w));
  }
  if (!h.ready_first) BeginAndReady(*rooms, source, transfers, now);

  Check(transfers.size() <= 1, "one room was handed over for transfer twice");
  for (const session::TransferWork& work : transfers) {
    Check(work.room == kRoom, "a transfer for a room nobody began");
    kvrail::fuzz::CheckTransfer(work, h.contracts->prefill);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> lines = absl::StrSplit(input, absl::MaxSplits('\n', 2));
  lines.resize(3);
  const Header h = ReadHeader(lines[0]);
  if (!InInt(h.prefill_tp_size) || !InInt(h.prefill_tp_rank) || h.decode_tp_size < 1 ||
      h.decode_tp_size > 1024 || h.decode_tp_rank < 0 || h.decode_tp_rank >= h.decode_tp_size) {
    return 0;  // no registration frame or prefill identity holds these
  }
  absl::StatusOr<layout::Manifest> source = layout::ParseManifest(lines[1]);
  absl::StatusOr<layout::Manifest> destination = layout::ParseManifest(lines[2]);
  if (source.ok() && destination.ok()) FuzzPlan(h, *source, *destination);
  if (h.through_rooms) {
    FuzzRooms(h, source.ok() ? std::optional(*source) : std::nullopt, lines[2]);
  }
  return 0;
}
