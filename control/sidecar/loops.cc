// The CachePD inbox and the ticker: timeouts, heartbeats, fence waits, and the prefill's
// re-registration with a bootstrap server that came back (sidecar_impl.h).
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"
#include "control/layout/contract.h"
#include "control/sidecar/liveness.h"
#include "control/sidecar/sidecar_impl.h"
#include "control/wire/digest.h"
#include "control/wire/proof.h"
#include "control/wire/registration.h"
#include "engine/base/error.h"
#include "engine/transport/bounds.h"

namespace kvrail::sidecar {
namespace {

// One quick /health probe (CACHEPD §1.6): the caller counts failures.
bool Healthy(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> server = SplitHostPort(address, "bootstrap");
  if (!server.ok()) return false;
  bootstrap::BootstrapClientOptions quick;
  quick.retries = 0;
  quick.connect_timeout = std::chrono::milliseconds(500);
  quick.read_timeout = std::chrono::milliseconds(1000);
  quick.deadline = std::chrono::milliseconds(1500);
  return bootstrap::BootstrapClient(server->first, server->second, quick).Health().ok();
}

}  // namespace

bool Sidecar::Impl::KeyAllowsLocked(const std::string& user_id,
                                    const std::vector<std::string>& message,
                                    const std::string& host) {
  const absl::Status allowed =
      prefill ? keys.CheckAtPrefill(user_id, message) : KeyBinding::CheckAtDecode(user_id, message);
  if (allowed.ok()) return true;
  RefuseLocked(host, "peer message refused: " + DescribeError(allowed));
  return false;
}

void Sidecar::Impl::InboxLoop() {
  // What is queued is read first (up to kBatch messages) and then posted to the owner as one
  // job: the inbox reads on while the owner applies it, and the work the batch starts (a
  // prefill's transfers into the strands, a decode's events) starts once per batch. The inbox
  // waits for the owner only when kMaxBatchesQueued of its batches are still queued there, so
  // that a flood stays in ZeroMQ's bounded queues, not in the owner's.
  constexpr size_t kBatch = 16;
  constexpr size_t kMaxBatchesQueued = 8;
  bool closed = false;
  while (!stop.load() && !closed) {
    auto batch = std::make_shared<std::vector<InboxMessage>>(kBatch);
    size_t count = 0;
    while (count < kBatch) {
      InboxMessage& in = (*batch)[count];
      absl::StatusOr<std::optional<std::vector<std::string>>> message = inbox->Receive(
          count == 0 ? absl::Milliseconds(100) : absl::ZeroDuration(), &in.user_id, &in.host);
      if (!message.ok()) {
        if (message.status().code() != absl::StatusCode::kInvalidArgument) {
          closed = true;
          break;
        }
        in.dropped = message.status();
      } else if (!message->has_value()) {
        break;
      } else {
        in.dropped = absl::OkStatus();
        in.frames = **std::move(message);
      }
      ++count;
    }
    if (count == 0) continue;
    batch->resize(count);
    inbox_batches_queued.fetch_add(1);
    PostOwned([this, batch] {
      inbox_batches_queued.fetch_sub(1);
      for (InboxMessage& in : *batch) HandleInboxMessageLocked(in);
    });
    if (inbox_batches_queued.load() > kMaxBatchesQueued) Owned([] {});  // the owner catches up
  }
}

void Sidecar::Impl::HandleInboxMessageLocked(InboxMessage& in) {
  AssertOnOwner("HandleInboxMessageLocked");
  const std::string& host = in.host;
  if (!in.dropped.ok()) {
    RefuseLocked(host, absl::StrCat("peer message dropped: ", in.dropped.message()));
    return;
  }
  std::vector<std::string>& message = in.frames;
  ++stats.peer_messages;
  if (!attached) {
    RefuseLocked(host, "peer message before the engine attached its arena: dropped");
    return;
  }
  // CURVE on: the sending key's role and rank must match what the message claims, before
  // anything of it is stored (key_binding.h).
  if (options.curve && !KeyAllowsLocked(in.user_id, message, host)) return;
  if (!prefill) {
    if (wire::IsSenderProof(message)) {
      if (absl::Status kept = senders->OnProof(message); !kept.ok()) {
        RefuseLocked(host, "sender proof dropped: " + DescribeError(kept));
      }
      return;
    }
    if (SenderProofRequiredLocked(message)) {
      if (absl::Status proven = senders->Check(message); !proven.ok()) {
        RefuseLocked(host, "peer message refused: " + DescribeError(proven));
        return;
      }
    }
    if (wire::IsRoomDigest(message)) {
      KeepDigestLocked(message, host);
      return;
    }
    if (options.verify_digest && TakeForDigestLocked(message)) return;
    DeliverSuccessLocked(message, host);
    return;
  }
  RegistrationGate::Admission admission = gate.Admit(std::move(message));
  if (!admission.refused.ok()) {
    RefuseLocked(host, "peer message refused: " + DescribeError(admission.refused));
  }
  if (admission.pass) HandleMessageLocked(*admission.pass, absl::Now(), host);
  if (admission.check) {
    if (options.curve) {
      if (absl::StatusOr<zmq_auth::KeyIdentity> key = KeyOf(in.user_id); key.ok()) {
        keys.Claim(admission.check->ticket, admission.check->session_id, *key);
      }
    }
    Defer([this, check = *std::move(admission.check)]() mutable {
      VerifyRegistration(std::move(check));
    });
  }
}

bool Sidecar::Impl::SenderProofRequiredLocked(const std::vector<std::string>& message) const {
  switch (options.sender_proofs) {
    case SenderProofs::kOff:
      return false;
    case SenderProofs::kRequired:
      return true;
    case SenderProofs::kAuto:
      break;
  }
  const std::optional<std::pair<uint64_t, uint32_t>> id = RoomAndRank(message);
  if (!id) return false;  // the state machine refuses it and says why
  const std::optional<session::DecodeRoomView> room = decode->Find(id->first);
  if (!room) return false;
  auto node = nodes.find(room->bootstrap_address);
  return node != nodes.end() && node->second->kvrail;
}

void Sidecar::Impl::RefuseLocked(const std::string& host, const std::string& line) {
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

void Sidecar::Impl::HandleMessageLocked(const std::vector<std::string>& message, absl::Time now,
                                        const std::string& host) {
  AssertOnOwner("HandleMessageLocked");
  absl::Status rejected;
  if (prefill) {
    session::PrefillOutput out = prefill->OnMessage(message, now);
    rejected = out.rejected;
    ApplyLocked(std::move(out));
  } else {
    session::DecodeOutput out = decode->OnMessage(message, now);
    rejected = out.rejected;
    ApplyLocked(std::move(out));
  }
  if (!rejected.ok()) RefuseLocked(host, "peer message refused: " + DescribeError(rejected));
}

void Sidecar::Impl::VerifyRegistration(RegistrationGate::Check check) {
  const std::string session = check.session_id;
  strands.Post(session, [this, check = std::move(check)] {
    // A registration that does not parse is the state machine's to refuse (and answer, CACHEPD
    // §3.2.3): only a well-formed claim on a session needs its owner's word.
    absl::Status verdict;
    std::string key_digest;
    absl::StatusOr<wire::Registration> registration = wire::ParseRegistration(
        check.registration, [](absl::string_view) { return absl::OkStatus(); });
    absl::StatusOr<layout::Contract> contract =
        registration.ok() ? layout::ParseContract(registration->contract_wire)
                          : absl::StatusOr<layout::Contract>(registration.status());
    // CURVE on: the session's handshake endpoint must hold the key that sent the registration,
    // so a registration of another decode's session fails here (its endpoint never answers).
    std::optional<zmq_auth::CurveClientKeys> curve_keys;
    if (options.curve) {
      Owned([&] {
        const zmq_auth::KeyIdentity* claimant = keys.Claimant(check.ticket);
        std::optional<std::string> server_key =
            claimant ? options.curve->allowed->PublicKeyOf(*claimant) : std::nullopt;
        if (server_key) curve_keys = ClientKeys(*server_key);
      });
    }
    if (contract.ok() && options.curve && !curve_keys) {
      verdict = absl::PermissionDeniedError(
          absl::StrCat("registration of decode session ", check.session_id,
                       " refused: CURVE is on and no allowed key sent it"));
    } else if (contract.ok()) {
      // Fetched for this check alone, not cached: the data plane fetches its own when a room
      // first moves, so a decode that died meanwhile is found dead then, not written to.
      absl::StatusOr<v1::HandshakeDescriptor> descriptor = transport::FetchDescriptor(
          check.session_id, options.handshake_timeout, curve_keys ? &*curve_keys : nullptr);
      absl::StatusOr<transport::RemoteRegions> regions =
          descriptor.ok() ? transport::RemoteRegions::FromDescriptor(*descriptor)
                          : absl::StatusOr<transport::RemoteRegions>(descriptor.status());
      if (!regions.ok()) {
        verdict = absl::UnavailableError(
            absl::StrCat("registration of decode session ", check.session_id,
                         " refused: its descriptor could not be fetched to verify it: ",
                         DescribeError(regions.status())));
      } else {
        verdict = CheckOwner(*registration, static_cast<uint64_t>(contract->ArenaBytes()),
                             descriptor->cachepd_endpoint(), *regions);
        key_digest = descriptor->session_key_digest();
      }
    }
    if (verdict.ok() && contract.ok() &&
        options.cachepd_revision.value_or(contract->revision) == contract->revision) {
      // The form this decode is answered in, from the form its contract came in (CACHEPD
      // §12.12): once per verified registration.
      spdlog::info("event=decode_registration session={} cachepd_revision={} status_frames={}",
                   check.session_id, std::string(layout::RevisionName(contract->revision)),
                   contract->revision == layout::Revision::kSnapshot ? 5 : 7);
    }
    Owned([&] {
      if (!verdict.ok()) {
        ++stats.peer_messages_rejected;
        ++stats.registrations_refused;
        spdlog::warn("prefill: {}", DescribeError(verdict));
      }
      if (options.curve) {
        keys.Verified(check.ticket, verdict.ok());
        if (verdict.ok() && curve_keys && registration.ok()) {
          // Statuses to the registration's reply endpoint and the data plane's descriptor
          // fetches go to the key that was just verified.
          outbox->SetServerKey(wire::ReplyEndpoint(registration->endpoint, registration->port),
                               curve_keys->server_public_key);
          MutexLock lock(&server_keys_mu);
          session_server_keys[check.session_id] = curve_keys->server_public_key;
        }
      }
      RegistrationGate::Release release =
          gate.Verified(check.ticket, verdict.ok(), verdict.ok() ? key_digest : std::string());
      // Held messages: the peer that sent them is not kept; the session they name stands in.
      const std::string host = check.session_id.substr(0, check.session_id.rfind(':'));
      for (const absl::Status& refused : release.refused) {
        RefuseLocked(host, "peer message refused: " + DescribeError(refused));
      }
      const absl::Time now = absl::Now();
      for (const std::vector<std::string>& message : release.pass) {
        HandleMessageLocked(message, now, host);
      }
      if (release.next) {
        Defer([this, next = *std::move(release.next)]() mutable {
          VerifyRegistration(std::move(next));
        });
      }
    });
  });
}

// Peers whose sockets refuse connections are gone (liveness.h). A prefill drops a gone
// decode's session: its rooms fail, and its registration, data-plane link, PUSH socket and
// scheduler queue go, so that decodes restarting leave nothing behind; so does a session whose
// port answers for another process (session_identity.cc), and one whose endpoint has answered
// no probe for --registration-ttl (a host cut off or powered down, a process stopped, a port
// taken by a program that is not kvrail). A
// decode fails the rooms a gone prefill rank owes, and answers its fences. Every peer is probed
// at once: a hundred silent ones cost one probe timeout.
void Sidecar::Impl::ProbePeers(const std::vector<std::string>& peers) {
  std::vector<Reach> reach = ProbeEndpoints(peers, absl::Milliseconds(500));
  const std::vector<std::string> gone = options.role == Role::kPrefill
                                            ? ConfirmSessions(peers, reach)
                                            : std::vector<std::string>(peers.size());
  Owned([&] {
    const absl::Time now = absl::Now();
    for (size_t i = 0; i < peers.size(); ++i) {
      const std::string& peer = peers[i];
      if (decode) {
        const std::vector<std::string> known_gone = decode->GonePrefills();
        const bool was_gone = std::binary_search(known_gone.begin(), known_gone.end(), peer);
        if (reach[i] == Reach::kListening && was_gone) {
          spdlog::info("decode: prefill rank at {} listens again", peer);
          decode->OnPrefillListening(peer);
        }
        if (reach[i] != Reach::kRefused || was_gone) continue;
        spdlog::warn("decode: prefill rank at {} is gone (connection refused)", peer);
        ApplyLocked(decode->OnPrefillGone(peer, now));
        // The next room looks the rank up again: one restarted on another port is found there,
        // and one the bootstrap server still lists here fails at once (DecodeRooms::OnRoute).
        for (auto& [address, node] : nodes) {
          for (auto it = node->endpoints.begin(); it != node->endpoints.end();) {
            it = it->second == peer ? node->endpoints.erase(it) : std::next(it);
          }
        }
        continue;
      }
      if (!prefill) break;
      if (!gone[i].empty()) {
        DropSessionLocked(peer, gone[i], Drop::kOtherProcess, now);
        continue;
      }
      if (reach[i] == Reach::kRefused) {
        DropSessionLocked(peer,
                          absl::StrCat("Decode session ", peer,
                                       " is gone: its handshake endpoint refuses connections"),
                          Drop::kRefused, now);
        continue;
      }
      auto [reached, first] = session_reached.try_emplace(peer, now);
      if (reach[i] == Reach::kListening) {
        reached->second = now;
      } else if (!first && now - reached->second >= options.registration_ttl) {
        DropSessionLocked(
            peer,
            absl::StrCat("Decode session ", peer, " is unreachable: its handshake endpoint has ",
                         "answered no probe for ", absl::FormatDuration(now - reached->second),
                         " (--registration-ttl ", absl::FormatDuration(options.registration_ttl),
                         ")"),
            Drop::kSilent, now);
      }
    }
    // Sessions no longer registered (dropped, replaced, refused) are not remembered.
    if (prefill) {
      for (auto it = session_reached.begin(); it != session_reached.end();) {
        it = prefill->Registration(it->first) == nullptr ? session_reached.erase(it) : ++it;
      }
      gate.ForgetUnless(
          [this](const std::string& session) { return prefill->Registration(session) != nullptr; });
    }
  });
  std::vector<transport::PeerId> forget;
  Owned([&] { forget.swap(forget_peers); });
  if (!scheduler) return;
  std::vector<transport::PeerId> busy;
  for (transport::PeerId id : forget) {
    if (!scheduler->ForgetPeer(id)) busy.push_back(id);  // a room still fencing: next time
  }
  // A gone peer's endpoints, sockets and buffers were freed: give the pages back to the system
  // rather than keep them in the allocator's free lists.
  if (forget.size() > busy.size()) malloc_trim(0);
  Owned([&] { forget_peers.insert(forget_peers.end(), busy.begin(), busy.end()); });
}

void Sidecar::Impl::DropSessionLocked(const std::string& session, const std::string& reason,
                                      Drop why, absl::Time now) {
  AssertOnOwner("DropSessionLocked");
  session::PrefillOutput out;
  std::optional<std::string> endpoint =
      prefill->DropSession(session, reason, now, out,
                           why == Drop::kRegistry ? session::FailureCause::kExpired
                                                  : session::FailureCause::kPeerFailed);
  session_reached.erase(session);
  gate.Forget(session);
  keys.Forget(session);
  {
    MutexLock lock(&server_keys_mu);
    session_server_keys.erase(session);  // restarted decodes must leave no key behind
  }
  if (!endpoint) return;
  spdlog::info("prefill: {}: dropped", reason);
  static constexpr const char* kLabels[] = {"refused", "other_process", "silent", "registry"};
  metrics.SessionDropped(session, kLabels[static_cast<int>(why)]);
  ApplyLocked(std::move(out));
  Defer([this, session, endpoint = *endpoint] { DropPeer(session, endpoint); });
}

// A bootstrap server that restarted has forgotten this rank (however briefly it was down): when
// it answers but does not list this rank's endpoint, register again (an identical registration
// changes nothing, CACHEPD §2.1).
void Sidecar::Impl::ReregisterIfForgotten() {
  MutexLock attach_lock(&attach_mu);
  if (!registration) return;
  absl::StatusOr<std::pair<std::string, int>> server =
      SplitHostPort(options.bootstrap, "--bootstrap");
  if (!server.ok()) return;
  bootstrap::BootstrapClientOptions quick;
  quick.retries = 0;
  quick.connect_timeout = std::chrono::milliseconds(500);
  quick.read_timeout = std::chrono::milliseconds(1000);
  quick.deadline = std::chrono::milliseconds(300);  // a rank not listed answers 500 at once
  quick.bearer_token = options.bootstrap_token;
  const bootstrap::BootstrapClient client(server->first, server->second, quick);
  if (!client.Health().ok()) {
    if (bootstrap_answered) {
      spdlog::warn("prefill rank {}: bootstrap {} does not answer /health", options.tp_rank,
                   options.bootstrap);
    }
    bootstrap_answered = false;
    return;
  }
  bootstrap_answered = true;
  absl::StatusOr<bootstrap::RankEndpoint> listed =
      client.LookupRank(registration->RankInDpGroup(), registration->DpGroup());
  if (listed.ok() && *listed == registration->endpoint) return;
  const absl::Status again = RegisterWithBootstrap();
  if (again.ok()) {
    spdlog::info("prefill rank {}: registered again with bootstrap {} (it did not list us)",
                 options.tp_rank, options.bootstrap);
  } else {
    spdlog::warn("prefill rank {}: registering again with bootstrap {}: {}", options.tp_rank,
                 options.bootstrap, DescribeError(again));
  }
}

void Sidecar::Impl::ForgetUnusedRoutes() {
  // Long enough for what was queued to such a route (a late Failed frame) to have gone out.
  constexpr absl::Duration kUnused = absl::Seconds(10);
  const std::vector<std::string> unused = outbox->UnusedSince(absl::Now() - kUnused);
  if (unused.empty()) return;
  std::set<std::string> live;
  Owned([&] {
    if (prefill) {
      for (const auto& peer : prefill->Registrations()) live.insert(peer->reply_endpoint);
    }
    for (const auto& [address, node] : nodes) {
      for (const auto& [rank, endpoint] : node->endpoints) live.insert(endpoint);
    }
  });
  for (const std::string& endpoint : unused) {
    if (live.count(endpoint) == 0) outbox->Forget(endpoint);
  }
}

void Sidecar::Impl::TickerLoop() {
  absl::Time next_heartbeat = absl::Now();
  const absl::Duration interval = session::EffectiveHeartbeatInterval(options.timeouts);
  absl::Time last_turn = absl::Now();
  while (!stop.load()) {
    absl::SleepFor(absl::Milliseconds(50));
    // A turn that came far later than asked: this process was stopped (SIGSTOP, a debugger, a
    // frozen container) or starved. Its prefill peers may have dropped its sessions meanwhile
    // (silent for --registration-ttl), so a decode registers again with the next room to each
    // (an identical registration changes nothing, CACHEPD §2.1).
    const absl::Time turn = absl::Now();
    const absl::Duration held = turn - last_turn;
    last_turn = turn;
    const bool held_long = held > absl::Seconds(1);  // twenty turns
    // What the limiter held back goes out once its peer's interval has passed: never silent.
    for (const auto& [peer, count] : peer_log.TakeHeldBack(session::PeerLogLimiter::Clock::now())) {
      spdlog::warn(
          "{}: {} more refusals of messages or connections from {} held back in the "
          "last 10 s",
          role_name, count, peer);
    }
    std::vector<std::string> probe;
    std::vector<std::string> peers;  // sessions (prefill) or PULL endpoints (decode) to probe
    bool probe_own_bootstrap = false;
    bool beat = false;
    const bool attached_now = Owned([&] {
      if (!attached) return false;
      const absl::Time now = absl::Now();
      if (decode && held_long) {
        const std::vector<std::string> nodes = decode->BootstrapAddresses();
        for (const std::string& node : nodes) decode->ForgetPeerSets(node);
        spdlog::warn(
            "decode: this sidecar was held for {} (stopped or starved): registering again with "
            "the prefill ranks of {} node(s) at their next room",
            absl::FormatDuration(held), nodes.size());
      }
      if (prefill) {
        ApplyLocked(prefill->Tick(now));
      } else {
        ApplyLocked(decode->Tick(now));
      }
      if (now >= next_heartbeat) {
        if (decode) {
          probe = decode->BootstrapAddresses();
          peers = decode->PrefillEndpoints();
          // Gone ranks too, until they listen again (a new room is not routed to them).
          const size_t live = peers.size();
          for (std::string& gone : decode->GonePrefills()) {
            if (!std::binary_search(peers.begin(), peers.begin() + live, gone)) {
              peers.push_back(std::move(gone));
            }
          }
        } else {
          for (const auto& peer : prefill->Registrations()) {
            peers.push_back(peer->registration.session_id);
          }
        }
        probe_own_bootstrap = prefill.has_value();
        next_heartbeat = now + interval;
        beat = true;
      }
      return true;
    });
    if (!attached_now) continue;
    ProbePeers(peers);
    if (beat) ForgetUnusedRoutes();
    if (beat) PublishDescriptor();              // --registry: a decode whose descriptor changed
    for (const std::string& address : probe) {  // HTTP, so outside the lock
      const bool ok = Healthy(address);
      Owned([&] {
        if (decode) ApplyLocked(decode->OnHealth(address, ok, absl::Now()));
      });
    }
    if (probe_own_bootstrap) ReregisterIfForgotten();
  }
}

}  // namespace kvrail::sidecar
