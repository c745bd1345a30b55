// Fuzz harness: the engine API's requests (proto/kvrail/v1/engine.proto EngineRequest), taken
// as deep as the sidecar takes them without sockets.
//
// The sidecar's handler (SidecarCore::Handle, control/sidecar/sidecar_core.cc) runs only inside
// a started sidecar, which binds its sockets and a transport; what it does with each request is
// replayed here on the pure layers it feeds, with one fixed contract on both sides
// (kEngineApiCase, planner_cases.h: state groups and a full-history group; P = D = 1):
//   * AttachArena: the contract is parsed and checked (§4.4), a stage list validated
//     (§10.1), and both roles' room state machines are created with it. Whatever a prefill
//     attaches must give a bootstrap registration the bootstrap server accepts (§2.1), and
//     whatever a decode attaches a registration a prefill can read (§3.2), with the same
//     canonical contract.
//   * Ready: the source manifest is parsed; a prefill rank with one decode destination that
//     pre-allocated the same blocks begins the room and makes it ready; the transfer it hands
//     over is expanded as the sidecar does (every copy inside both arenas, copy_bounds.h); once
//     it landed, the Success sent must read back (strict status parse) with the engine's room,
//     token and speculative ids.
//   * Expect: the destination manifest is parsed and checked (§5.3); a decode rank begins the
//     room, is given a route to one prefill rank and allocates; its registration and
//     pre-allocation must be accepted by that prefill rank, whose transfer (the same blocks as
//     source) is expanded and checked, and whose Success must complete the room on the decode.
//   * Poll and Abort: the rooms' views and abort paths on both roles.
// Every rejection must carry the category of what was wrong (engine/base/error.h).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "control/bootstrap/registration.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/peer_messages.h"
#include "control/plan/pipeline.h"
#include "control/plan/planner.h"
#include "control/session/decode_rooms.h"
#include "control/session/prefill_rooms.h"
#include "control/wire/limits.h"
#include "control/wire/preallocation.h"
#include "control/wire/status.h"
#include "engine/base/error.h"
#include "proto/kvrail/v1/engine.pb.h"
#include "tests/fuzz/check.h"
#include "tests/fuzz/copy_bounds.h"
#include "tests/fuzz/planner_cases.h"
#include "tests/fuzz/quiet_protobuf.h"

namespace {

using kvrail::CategoryOf;
using kvrail::ErrorCategory;
using kvrail::fuzz::Check;
namespace layout = kvrail::layout;
namespace plan = kvrail::plan;
namespace session = kvrail::session;
namespace v1 = kvrail::v1;
namespace wire = kvrail::wire;

constexpr char kPrefillEndpoint[] = "tcp://127.0.0.1:18000";
constexpr uint64_t kArenaBase = 0x7e0000000000;
constexpr int64_t kToken = 9;
const absl::Time kNow = absl::FromUnixSeconds(1000);

struct Fixture {
  layout::Contract contract;
  plan::DecodeTargets targets;  // decode rank 0's against prefill TP 1
};

const Fixture& Fixed() {
  static const Fixture* const fixture = [] {
    auto* f = new Fixture;
    f->contract = kvrail::fuzz::LoadPlannerCase(kvrail::fuzz::kEngineApiCase).decode;
    absl::StatusOr<plan::Planner> planner = plan::Planner::Create(1, 1, f->contract, f->contract);
    Check(planner.ok(), "the fixed contract does not plan against itself");
    f->targets = *planner->TargetsFor(0);
    return f;
  }();
  return *fixture;
}

void CheckCategory(const absl::Status& status, ErrorCategory category, const char* what) {
  Check(!status.ok() && CategoryOf(status) == category,
        [&] { return absl::StrCat(what, " rejected without its category: ", status.ToString()); });
}

session::PrefillRooms NewPrefill(const layout::Contract& contract,
                                 std::optional<plan::StageFilter> stage = std::nullopt) {
  session::PrefillIdentity identity;
  identity.contract = contract;
  identity.stage = std::move(stage);
  absl::StatusOr<session::PrefillRooms> rooms = session::PrefillRooms::Create(identity);
  Check(rooms.ok(), "a prefill rank cannot start with an attached contract");
  return *std::move(rooms);
}

absl::StatusOr<session::DecodeRooms> NewDecode(const layout::Contract& contract) {
  session::DecodeIdentity identity;
  identity.endpoint = "127.0.0.1";
  identity.port = 17000;
  identity.session_id = "127.0.0.1:15000";
  identity.arena_base = kArenaBase;
  identity.contract = contract;
  return session::DecodeRooms::Create(identity);
}

// Every status frame set the prefill pushes must read back strictly (what a kvrail decode
// accepts); a Success must carry the Ready's token and speculative ids.
void CheckStatuses(const session::PrefillOutput& out, uint64_t room, int64_t token,
                   const std::optional<std::vector<int32_t>>& spec_ids) {
  for (const session::OutboundMessage& m : out.messages) {
    absl::StatusOr<wire::StatusMessage> status = wire::ParseStatus(m.frames);
    Check(status.ok(), [&] {
      return absl::StrCat("a status the prefill sent does not parse: ", status.status().ToString());
    });
    Check(status->room == room, "a status names another room");
    if (status->status == static_cast<int>(session::TransferPoll::kSuccess)) {
      Check(status->bootstrap_token == token, "Success lost the bootstrap token");
      const bool none = !spec_ids.has_value() || spec_ids->empty();
      Check(none ? !status->spec_candidate_ids.has_value() : status->spec_candidate_ids == spec_ids,
            "Success lost the speculative ids");
    }
  }
}

// The prefill side of a room that `transfers` moves: checks every copy, lets it land, checks
// what the prefill then sends, and returns it.
session::PrefillOutput Land(session::PrefillRooms& rooms, uint64_t room,
                            const std::vector<session::TransferWork>& transfers, int64_t token,
                            const std::optional<std::vector<int32_t>>& spec_ids) {
  Check(transfers.size() <= 1, "one room was handed over for transfer twice");
  session::PrefillOutput landed;
  for (const session::TransferWork& work : transfers) {
    kvrail::fuzz::CheckTransfer(work, rooms.identity().contract);
    // One transfer per data destination, as the sidecar prepares them; each lands.
    std::vector<std::string> sessions;
    for (const session::TransferDestination& d : work.destinations) {
      if (!d.peer->dummy && d.peer->copy_plan != nullptr) {
        sessions.push_back(d.peer->registration.session_id);
      }
    }
    const std::vector<uint64_t> ids =
        rooms.TransfersPrepared(room, work.generation, sessions, kNow, landed);
    Check(ids.size() == sessions.size(), "a prepared transfer is not taken");
    for (uint64_t id : ids) landed = rooms.TransferOutcome(id, absl::OkStatus(), "", kNow);
  }
  CheckStatuses(landed, room, token, spec_ids);
  return landed;
}

void FuzzAttach(const v1::AttachArena& attach) {
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(attach.contract());
  if (!contract.ok()) {
    CheckCategory(contract.status(), ErrorCategory::kInvalidContract, "AttachArena contract");
    return;
  }
  Check(layout::ValidateContract(*contract).ok(), "a parsed contract does not validate");
  // The sidecar's arena checks (one arena source, allocate_bytes against ArenaBytes) and its
  // default stage cut live in control/sidecar/arena_attach.cc; a stage list is validated here.
  std::optional<plan::PipelineLayout> pipeline;
  if (attach.fields_by_stage_size() > 1) {
    pipeline.emplace();
    pipeline->pp_size = attach.fields_by_stage_size();
    for (const v1::FieldList& stage : attach.fields_by_stage()) {
      pipeline->fields_by_stage.emplace_back(stage.field_ids().begin(), stage.field_ids().end());
    }
    const absl::Status valid = plan::ValidatePipelineLayout(*pipeline, *contract);
    if (!valid.ok()) {
      CheckCategory(valid, ErrorCategory::kUnsupportedLayout, "AttachArena fields_by_stage");
      return;
    }
  }
  (void)NewPrefill(*contract, pipeline ? std::optional(pipeline->FilterFor(0)) : std::nullopt);
  absl::StatusOr<std::string> canonical = layout::SerializeContract(*contract);
  if (!canonical.ok()) return;  // over the size cap once escaped: nothing can carry it

  // What the prefill registers with its bootstrap server (arena_attach.cc StartRooms).
  kvrail::bootstrap::PrefillRegistration r;
  r.world_size = pipeline ? pipeline->pp_size : 1;
  r.endpoint = {"127.0.0.1", 18000};
  r.contract = *contract;
  r.pipeline = pipeline;
  absl::StatusOr<std::string> body = kvrail::bootstrap::SerializeRegistration(r);
  Check(body.ok(), "an attached contract gives no bootstrap registration");
  absl::StatusOr<kvrail::bootstrap::ParsedRegistration> parsed =
      kvrail::bootstrap::ParseRegistration(*body);
  Check(parsed.ok(), [&] {
    return absl::StrCat("the bootstrap refuses an attached prefill's registration: ",
                        parsed.status().ToString());
  });
  Check(parsed->canonical_layout == *canonical, "the bootstrap reads another contract");

  // What the decode registers with each prefill rank (§3.2).
  absl::StatusOr<session::DecodeRooms> decode = NewDecode(*contract);
  Check(decode.ok(), [&] {
    return absl::StrCat("a decode rank cannot start with an attached contract: ",
                        decode.status().ToString());
  });
  absl::StatusOr<layout::DecodedRegistration> registration = layout::DecodeRegistration(
      decode->registration_frames(contract->revision).value_or(std::vector<std::string>{}));
  Check(registration.ok(), [&] {
    return absl::StrCat("a prefill refuses an attached decode's registration: ",
                        registration.status().ToString());
  });
  Check(*layout::SerializeContract(registration->contract) == *canonical,
        "a prefill reads another contract from the decode's registration");
}

void FuzzReady(const v1::Ready& ready) {
  const Fixture& f = Fixed();
  std::optional<layout::Manifest> source;
  if (!ready.source_manifest().empty()) {
    absl::StatusOr<layout::Manifest> parsed = layout::ParseManifest(ready.source_manifest());
    if (!parsed.ok()) {
      CheckCategory(parsed.status(), ErrorCategory::kInvalidManifest, "Ready source manifest");
      return;
    }
    source = *std::move(parsed);
  }
  const uint64_t room = ready.room();
  session::PrefillRooms rooms = NewPrefill(f.contract);
  std::vector<session::TransferWork> transfers;
  // One decode destination that pre-allocated the blocks the source names.
  absl::StatusOr<session::DecodeRooms> decode = NewDecode(f.contract);
  Check(decode.ok(), "the fixed decode does not start");
  session::PrefillOutput registered = rooms.OnMessage(
      decode->registration_frames(f.contract.revision).value_or(std::vector<std::string>{}), kNow);
  Check(registered.rejected.ok(), "the fixed decode's registration is refused");
  absl::StatusOr<std::string> blocks =
      source ? layout::SerializeManifest(*source) : absl::StatusOr<std::string>("");
  if (room <= wire::kMaxRoom && blocks.ok() && !blocks->empty()) {
    absl::StatusOr<std::vector<std::string>> frames =
        wire::BuildPreallocation({room, "127.0.0.1:15000", *blocks});
    if (frames.ok()) {
      session::PrefillOutput out = rooms.OnMessage(*frames, kNow);
      CheckStatuses(out, room, -1, std::nullopt);
    }
  }

  // A room its pre-allocation already ended (a Failed state) is refused, naming that end
  // (docs/ENGINE-API.md, "What the engine can trust"); any other room in bound begins.
  const std::optional<session::TransferPoll> before = rooms.State(room);
  const bool ended =
      before == session::TransferPoll::kFailed || before == session::TransferPoll::kSuccess;
  absl::StatusOr<session::PrefillOutput> begun = rooms.BeginRoom(room, kNow);
  Check(begun.ok() == (room <= wire::kMaxRoom && !ended), "BeginRoom's room bound");
  if (ended) return;
  if (!begun.ok()) return;
  session::RoomReady signal;
  signal.source_manifest = source;
  signal.bootstrap_token = ready.bootstrap_token();
  if (ready.speculative_ids_size() > 0) {
    signal.spec_candidate_ids.emplace(ready.speculative_ids().begin(),
                                      ready.speculative_ids().end());
  }
  const std::optional<std::vector<int32_t>> spec_ids = signal.spec_candidate_ids;
  absl::StatusOr<session::PrefillOutput> out = rooms.Ready(room, std::move(signal), kNow);
  if (ready.bootstrap_token() < -1) {
    Check(!out.ok() && out.status().code() == absl::StatusCode::kInvalidArgument,
          "Ready takes a token below -1");
    return;
  }
  Check(out.ok(),
        [&] { return absl::StrCat("Ready refuses a begun room: ", out.status().ToString()); });
  CheckStatuses(*out, room, ready.bootstrap_token(), spec_ids);
  Land(rooms, room, out->transfers, ready.bootstrap_token(), spec_ids);
}

void FuzzExpect(const v1::Expect& expect) {
  const Fixture& f = Fixed();
  absl::StatusOr<layout::Manifest> manifest = layout::ParseManifest(expect.destination_manifest());
  if (!manifest.ok()) {
    CheckCategory(manifest.status(), ErrorCategory::kInvalidManifest,
                  "Expect destination manifest");
    return;
  }
  // The sidecar then checks bootstrap_address as host:port (SplitHostPort, sidecar.cc).
  const absl::Status valid = layout::ValidateManifest(*manifest, f.contract);
  if (!valid.ok()) {
    CheckCategory(valid, ErrorCategory::kInvalidManifest, "Expect destination manifest");
    return;
  }
  const uint64_t room = expect.room();
  absl::StatusOr<session::DecodeRooms> decode = NewDecode(f.contract);
  Check(decode.ok(), "the fixed decode does not start");
  absl::StatusOr<session::DecodeOutput> begun =
      decode->BeginRoom(room, expect.bootstrap_address(), kNow);
  Check(begun.ok() == (room <= wire::kMaxRoom), "BeginRoom's room bound");
  if (!begun.ok()) return;
  // What the bootstrap lookups would give (decode_routing.cc Route): one prefill rank.
  session::RoomRoute route;
  route.targets = f.targets;
  route.endpoints.push_back({0, kPrefillEndpoint});
  absl::StatusOr<session::DecodeOutput> routed = decode->OnRoute(room, route, kNow);
  Check(routed.ok(), "a route from the planner is refused");
  absl::StatusOr<session::DecodeOutput> allocated = decode->OnAllocated(room, *manifest, kNow);
  Check(allocated.ok(), [&] {
    return absl::StrCat("a manifest that passed §5.3 is not allocated: ",
                        allocated.status().ToString());
  });

  session::PrefillRooms prefill = NewPrefill(f.contract);
  std::vector<session::TransferWork> transfers;
  for (const auto* out : {&*routed, &*allocated}) {
    for (const session::OutboundMessage& m : out->messages) {
      Check(m.endpoint == kPrefillEndpoint, "a message for a rank off the route");
      session::PrefillOutput taken = prefill.OnMessage(m.frames, kNow);
      Check(taken.rejected.ok(), [&] {
        return absl::StrCat("the prefill refuses what the decode sent: ",
                            taken.rejected.ToString());
      });
      CheckStatuses(taken, room, kToken, std::nullopt);
      for (session::TransferWork& w : taken.transfers) transfers.push_back(std::move(w));
    }
  }
  absl::StatusOr<session::PrefillOutput> began = prefill.BeginRoom(room, kNow);
  Check(began.ok(), "the prefill refuses a room the decode pre-allocated");
  session::RoomReady ready{*manifest, kToken, std::nullopt};
  absl::StatusOr<session::PrefillOutput> out = prefill.Ready(room, std::move(ready), kNow);
  Check(out.ok(), "Ready refuses a begun room");
  for (session::TransferWork& w : out->transfers) transfers.push_back(std::move(w));
  Check(!transfers.empty(), "a room with a valid manifest on both sides moves nothing");
  session::PrefillOutput landed = Land(prefill, room, transfers, kToken, std::nullopt);
  for (const session::OutboundMessage& m : landed.messages) (void)decode->OnMessage(m.frames, kNow);
  Check(decode->State(room) == session::TransferPoll::kSuccess,
        "the decode room does not succeed once its one prefill rank reported Success");
}

void FuzzAbort(const v1::Abort& abort) {
  const Fixture& f = Fixed();
  session::PrefillRooms prefill = NewPrefill(f.contract);
  // A room nobody named makes no state; a begun one fails.
  (void)prefill.Abort(abort.room(), abort.reason(), kNow);
  Check(prefill.room_count() == 0, "an Abort of an unknown room made state");
  if (prefill.BeginRoom(abort.room(), kNow).ok()) {
    (void)prefill.Abort(abort.room(), abort.reason(), kNow);
    Check(prefill.State(abort.room()) == session::TransferPoll::kFailed,
          "an aborted room is not Failed");
  }
  (void)prefill.Tick(kNow + absl::Hours(1));
  absl::StatusOr<session::DecodeRooms> decode = NewDecode(f.contract);
  Check(decode.ok(), "the fixed decode does not start");
  if (decode->BeginRoom(abort.room(), "127.0.0.1:8998", kNow).ok()) {
    (void)decode->Fail(abort.room(), abort.reason(), kNow);
    Check(decode->State(abort.room()) == session::TransferPoll::kFailed,
          "a failed decode room is not Failed");
  }
}

void FuzzPoll(const v1::Poll& poll) {
  session::PrefillRooms prefill = NewPrefill(Fixed().contract);
  const int rooms = std::min(poll.rooms_size(), 256);
  for (int i = 0; i < rooms; ++i) {
    Check(!prefill.State(poll.rooms(i)).has_value(), "a fresh prefill rank knows a room");
  }
  for (int i = 0; i < rooms; ++i) {
    const uint64_t room = poll.rooms(i);
    Check(prefill.BeginRoom(room, kNow).ok() == (room <= wire::kMaxRoom), "BeginRoom's room bound");
    Check(prefill.State(room) == (room <= wire::kMaxRoom
                                      ? std::optional(session::TransferPoll::kBootstrapping)
                                      : std::nullopt),
          "a begun room is not Bootstrapping");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvrail::fuzz::QuietProtobuf();
  v1::EngineRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  switch (request.kind_case()) {
    case v1::EngineRequest::kAttach:
      FuzzAttach(request.attach());
      break;
    case v1::EngineRequest::kReady:
      FuzzReady(request.ready());
      break;
    case v1::EngineRequest::kExpect:
      FuzzExpect(request.expect());
      break;
    case v1::EngineRequest::kAbort:
      FuzzAbort(request.abort());
      break;
    case v1::EngineRequest::kPoll:
      FuzzPoll(request.poll());
      break;
    default:  // Stats reads counters only; an empty kind is answered "unknown request"
      break;
  }
  return 0;
}
