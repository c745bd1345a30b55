// A prefill's peers (prefill_sidecar.h): the CachePD messages decodes send it, the verification
// of their registrations (registration_gate.h), and the ticker's turn: timeouts, session probes
// and drops, and registering again with a bootstrap server that forgot this rank.
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"
#include "control/layout/contract.h"
#include "control/sidecar/liveness.h"
#include "control/sidecar/prefill_sidecar.h"
#include "control/wire/registration.h"
#include "control/wire/row_staging.h"
#include "engine/base/error.h"
#include "engine/transport/bounds.h"

namespace kvrail::sidecar {

absl::Status PrefillSidecar::CheckKeyLocked(const std::string& user_id,
                                            const std::vector<std::string>& message) {
  return keys.CheckAtPrefill(user_id, message);
}

void PrefillSidecar::OnPeerMessageLocked(InboxMessage& in) {
  const std::string& host = in.host;
  RegistrationGate::Admission admission = gate.Admit(std::move(in.frames));
  if (!admission.refused.ok()) {
    RefuseLocked(host, "peer message refused: " + DescribeError(admission.refused));
  }
  if (admission.pass) HandleMessageLocked(*admission.pass, RoomNow(), host);
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

void PrefillSidecar::HandleMessageLocked(const std::vector<std::string>& message, absl::Time now,
                                         const std::string& host) {
  AssertOnOwner("HandleMessageLocked");
  if (wire::IsStagingOffer(message)) {  // kvrail's own, for the room's first work
    KeepStagingOfferLocked(message, host);
    return;
  }
  session::PrefillOutput out = rooms->OnMessage(message, now);
  const absl::Status rejected = out.rejected;
  ApplyLocked(std::move(out));
  if (!rejected.ok()) RefuseLocked(host, "peer message refused: " + DescribeError(rejected));
}

void PrefillSidecar::KeepStagingOfferLocked(const std::vector<std::string>& message,
                                            const std::string& host) {
  absl::StatusOr<wire::StagingOffer> offer = wire::ParseStagingOffer(message);
  if (!offer.ok()) {
    RefuseLocked(host, "staging offer dropped: " + DescribeError(offer.status()));
    return;
  }
  staging_offers.Keep(*std::move(offer));
}

void PrefillSidecar::VerifyRegistration(RegistrationGate::Check check) {
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
      const absl::Time now = RoomNow();
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

bool PrefillSidecar::Turn(absl::Duration held, bool beat) {
  (void)held;  // a prefill registers nothing again after a stop: its decodes do
  std::vector<std::string> sessions;  // to probe
  const bool attached_now = Owned([&] {
    if (!attached) return false;
    ApplyLocked(rooms->Tick(RoomNow()));
    if (beat) {
      for (const auto& peer : rooms->Registrations()) {
        sessions.push_back(peer->registration.session_id);
      }
    }
    return true;
  });
  if (!attached_now) return false;
  ProbePeers(sessions);
  if (beat) ReregisterIfForgotten();
  return true;
}

// Peers whose sockets refuse connections are gone (liveness.h). A prefill drops a gone
// decode's session: its rooms fail, and its registration, data-plane link, PUSH socket and
// scheduler queue go, so that decodes restarting leave nothing behind; so does a session whose
// port answers for another process (session_identity.cc), and one whose endpoint has answered
// no probe for --registration-ttl (a host cut off or powered down, a process stopped, a port
// taken by a program that is not kvrail). A
// decode fails the rooms a gone prefill rank owes, and answers its fences. Every peer is probed
// at once: a hundred silent ones cost one probe timeout.
void PrefillSidecar::ProbePeers(const std::vector<std::string>& sessions) {
  std::vector<Reach> reach = ProbeEndpoints(sessions, absl::Milliseconds(500));
  const std::vector<std::string> gone = ConfirmSessions(sessions, reach);
  Owned([&] {
    if (!rooms) return;
    const absl::Time now = RoomNow();
    for (size_t i = 0; i < sessions.size(); ++i) {
      const std::string& peer = sessions[i];
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
    for (auto it = session_reached.begin(); it != session_reached.end();) {
      it = rooms->Registration(it->first) == nullptr ? session_reached.erase(it) : ++it;
    }
    gate.ForgetUnless(
        [this](const std::string& session) { return rooms->Registration(session) != nullptr; });
  });
  std::vector<transport::PeerId> forget;
  Owned([&] { forget.swap(forget_peers); });
  std::vector<transport::PeerId> busy;
  for (transport::PeerId id : forget) {
    if (!scheduler->ForgetPeer(id)) busy.push_back(id);  // a room still fencing: next time
  }
  // A gone peer's endpoints, sockets and buffers were freed: give the pages back to the system
  // rather than keep them in the allocator's free lists.
  if (forget.size() > busy.size()) malloc_trim(0);
  Owned([&] { forget_peers.insert(forget_peers.end(), busy.begin(), busy.end()); });
}

void PrefillSidecar::DropSessionLocked(const std::string& session, const std::string& reason,
                                       Drop why, absl::Time now) {
  AssertOnOwner("DropSessionLocked");
  session::PrefillOutput out;
  std::optional<std::string> endpoint =
      rooms->DropSession(session, reason, now, out,
                         why == Drop::kRegistry ? session::FailureCause::kExpired
                                                : session::FailureCause::kPeerFailed);
  session_reached.erase(session);
  gate.Forget(session);
  keys.Forget(session);
  {
    MutexLock lock(&server_keys_mu);
    session_server_keys.erase(session);  // restarted decodes must leave no key behind
  }
  ForgetWarmLinkLocked(session);
  logged_routes.erase(session);
  staging_offers.ForgetSession(session);
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
void PrefillSidecar::ReregisterIfForgotten() {
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
  quick.bearer_token = options.bootstrap_bearer_token;
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

void PrefillSidecar::LiveRoutesLocked(std::set<std::string>& live) const {
  if (!rooms) return;
  for (const auto& peer : rooms->Registrations()) live.insert(peer->reply_endpoint);
}

}  // namespace kvrail::sidecar
