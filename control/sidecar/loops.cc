// The CachePD inbox and the ticker's clock, which both roles share (sidecar_core.h): each
// message's common checks before the role has it (OnPeerMessageLocked), refusals, heartbeats'
// schedule and unused routes; the role's turn is Turn (prefill_peers.cc, decode_peers.cc).
#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "control/sidecar/sidecar_core.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

void SidecarCore::ReadInboxLocked() {
  // The owner reads the CachePD inbox itself, polled beside the engine API's socket
  // (engine_api::ServerLoop::socket): a peer message is applied by the thread that read it, with
  // no hand-off. At most kBatch messages per call, so that engine requests and posted jobs are
  // served between them under a flood; what is left stays in ZeroMQ's bounded queue and wakes
  // the next poll at once.
  AssertOnOwner("ReadInboxLocked");
  constexpr size_t kBatch = 16;
  if (stop.load()) return;
  for (size_t count = 0; count < kBatch; ++count) {
    InboxMessage in;
    absl::StatusOr<std::optional<std::vector<std::string>>> message =
        inbox->Receive(absl::ZeroDuration(), &in.user_id, &in.host);
    if (!message.ok()) {
      if (message.status().code() != absl::StatusCode::kInvalidArgument) return;  // closing
      in.dropped = message.status();
    } else if (!message->has_value()) {
      return;
    } else {
      in.dropped = absl::OkStatus();
      in.frames = **std::move(message);
    }
    HandleInboxMessageLocked(in);
  }
}

void SidecarCore::HandleInboxMessageLocked(InboxMessage& in) {
  AssertOnOwner("HandleInboxMessageLocked");
  const std::string& host = in.host;
  if (!in.dropped.ok()) {
    RefuseLocked(host, absl::StrCat("peer message dropped: ", in.dropped.message()));
    return;
  }
  ++stats.peer_messages;
  if (!attached) {
    RefuseLocked(host, "peer message before the engine attached its arena: dropped");
    return;
  }
  // CURVE on: the sending key's role and rank must match what the message claims, before
  // anything of it is stored (key_binding.h).
  if (options.curve) {
    if (const absl::Status allowed = CheckKeyLocked(in.user_id, in.frames); !allowed.ok()) {
      RefuseLocked(host, "peer message refused: " + DescribeError(allowed));
      return;
    }
  }
  OnPeerMessageLocked(in);
}

void SidecarCore::RefuseLocked(const std::string& host, const std::string& line) {
  ++stats.peer_messages_rejected;
  const std::string peer = host.empty() ? "an unknown peer" : host;
  const session::PeerLogLimiter::Verdict verdict =
      peer_log.Admit(peer, session::PeerLogLimiter::Clock::now());
  if (!verdict.log) return;
  spdlog::warn("{}: {} (from {}){}", role_name, line, peer,
               verdict.held_back == 0
                   ? ""
                   : absl::StrCat("; ", verdict.held_back, " more refusals from ", peer,
                                  " held back in the last 10 s"));
}

void SidecarCore::ForgetUnusedRoutes() {
  // Long enough for what was queued to such a route (a late Failed frame) to have gone out.
  constexpr absl::Duration kUnused = absl::Seconds(10);
  const std::vector<std::string> unused = outbox->UnusedSince(absl::Now() - kUnused);
  if (unused.empty()) return;
  std::set<std::string> live;
  Owned([&] { LiveRoutesLocked(live); });
  for (const std::string& endpoint : unused) {
    if (live.count(endpoint) == 0) outbox->Forget(endpoint);
  }
}

void SidecarCore::TickerLoop() {
  absl::Time next_heartbeat = absl::Now();
  const absl::Duration interval = session::EffectiveHeartbeatInterval(options.timeouts);
  absl::Time last_turn = absl::Now();
  while (!stop.load()) {
    absl::SleepFor(absl::Milliseconds(50));
    // A turn that came far later than asked: this process was stopped (SIGSTOP, a debugger, a
    // frozen container) or starved (the role's Turn says what that changes). Measured from the
    // end of the last turn, so that a turn that waited for the owner (an attach mapping and
    // filling a large arena) does not count as held.
    const absl::Time turn = absl::Now();
    const absl::Duration held = turn - last_turn;
    const bool held_long = held > absl::Seconds(1);  // twenty turns
    // What the limiter held back goes out once its peer's interval has passed: never silent.
    for (const auto& [peer, count] : peer_log.TakeHeldBack(session::PeerLogLimiter::Clock::now())) {
      spdlog::warn(
          "{}: {} more refusals of messages or connections from {} held back in the "
          "last 10 s",
          role_name, count, peer);
    }
    const bool beat = turn >= next_heartbeat;
    const bool attached = Turn(held_long ? held : absl::ZeroDuration(), beat);
    last_turn = absl::Now();
    if (!attached) continue;
    if (beat) {
      next_heartbeat = turn + interval;
      ForgetUnusedRoutes();
    }
  }
}

}  // namespace kvrail::sidecar
