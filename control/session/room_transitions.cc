#include "control/session/room_transitions.h"

#include <algorithm>
#include <iterator>

namespace kvrail::session {
namespace {

using P = TransferPoll;
constexpr std::optional<TransferPoll> kNew = std::nullopt;

// A prefill room: begun by its engine (Begin, Ready, LayersReady) or by a first pre-allocation,
// Bootstrapped once every decode rank it owes bytes has pre-allocated (CACHEPD §3.2), Success
// once every transfer of it landed (PrefillRooms::EndTransfers), Failed on any failure, once
// fenced (decision 0007).
constexpr RoomTransition kPrefill[] = {
    {kNew, P::kBootstrapping,
     "the engine's Begin, Ready or LayersReady, or a first pre-allocation"},
    {kNew, P::kBootstrapped, "the last pre-allocation, come before the engine's first call"},
    {P::kBootstrapping, P::kBootstrapped, "the last pre-allocation (CACHEPD §3.2)"},
    {P::kBootstrapped, P::kSuccess,
     "every transfer landed, or a dummy rank's Ready (nothing to write, §1.4)"},
    {kNew, P::kFailed, "a refusal or an abort of a room with no state yet"},
    {P::kBootstrapping, P::kFailed, "an abort, a timeout, a peer's failure, a refusal"},
    {P::kBootstrapped, P::kFailed, "an abort, a timeout, a write failure, once fenced"},
};

// A decode room: begun by its engine's Expect, Bootstrapped once routed (every prefill rank's
// endpoint looked up), WaitingForInput once its pre-allocations went out; a prefill rank's status
// frame may move it forward (§3.4 item 4: merged by the update rule, as the reference does),
// Success once every prefill rank it expects sent Success, Failed on any failure (its pages held
// until fenced).
constexpr RoomTransition kDecode[] = {
    {kNew, P::kBootstrapping, "the engine's Expect"},
    {P::kBootstrapping, P::kBootstrapped, "the route: every prefill rank looked up"},
    {P::kBootstrapping, P::kWaitingForInput, "a prefill rank's status frame (§3.4 item 4)"},
    {P::kBootstrapping, P::kTransferring, "a prefill rank's status frame (§3.4 item 4)"},
    {P::kBootstrapped, P::kWaitingForInput, "the pre-allocations sent (CACHEPD §3.3)"},
    {P::kBootstrapped, P::kTransferring, "a prefill rank's status frame (§3.4 item 4)"},
    {P::kWaitingForInput, P::kTransferring, "a prefill rank's status frame (§3.4 item 4)"},
    {P::kWaitingForInput, P::kSuccess, "every prefill rank it expects sent Success"},
    {P::kTransferring, P::kSuccess, "every prefill rank it expects sent Success"},
    {P::kBootstrapping, P::kFailed, "an abort, a lookup's failure, a timeout"},
    {P::kBootstrapped, P::kFailed, "an abort, a lost pre-allocation, a timeout"},
    {P::kWaitingForInput, P::kFailed, "an abort, a prefill rank's Failed, a timeout, a digest"},
    {P::kTransferring, P::kFailed, "an abort, a prefill rank's Failed, a timeout, a digest"},
};

}  // namespace

absl::Span<const RoomTransition> RoomTransitions(LedgerRole role) {
  switch (role) {
    case LedgerRole::kPrefill:
      return kPrefill;
    case LedgerRole::kDecode:
      return kDecode;
  }
  return {};
}

std::optional<TransferPoll> NextRoomState(LedgerRole role, std::optional<TransferPoll> current,
                                          TransferPoll update, bool* unlisted) {
  *unlisted = false;
  const TransferPoll next = UpdateTransferPoll(current, update);
  if (current == next) return std::nullopt;
  const absl::Span<const RoomTransition> table = RoomTransitions(role);
  const bool listed = std::any_of(table.begin(), table.end(), [&](const RoomTransition& t) {
    return t.from == current && t.to == next;
  });
  if (!listed) {
    *unlisted = true;
    return std::nullopt;
  }
  return next;
}

}  // namespace kvrail::session
