#include "control/sidecar/registration_gate.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "control/sidecar/session_key.h"
#include "control/wire/dispatch.h"
#include "control/wire/fence.h"
#include "control/wire/preallocation.h"
#include "control/wire/proof.h"
#include "control/wire/row_staging.h"

namespace kvrail::sidecar {

std::optional<std::string> SessionOf(const std::vector<std::string>& message,
                                     bool* is_registration) {
  *is_registration = false;
  if (wire::IsOwnerProof(message)) {
    absl::StatusOr<wire::OwnerProof> proof = wire::ParseOwnerProof(message);
    if (!proof.ok()) return std::nullopt;
    return proof->session_id;
  }
  if (wire::IsFenceRequest(message)) {
    absl::StatusOr<wire::FenceRequest> fence = wire::ParseFenceRequest(message);
    if (!fence.ok()) return std::nullopt;
    return fence->session_id;
  }
  if (wire::IsStagingOffer(message)) {
    absl::StatusOr<wire::StagingOffer> offer = wire::ParseStagingOffer(message);
    if (!offer.ok()) return std::nullopt;
    return offer->session_id;
  }
  switch (wire::Classify(message)) {
    case wire::MessageKind::kRegistration: {
      absl::StatusOr<wire::ReplyRoute> route = wire::ParseRegistrationReplyRoute(message);
      if (!route.ok()) return std::nullopt;
      *is_registration = true;
      return route->session_id;
    }
    case wire::MessageKind::kPreallocation: {
      absl::StatusOr<wire::PreallocationRouteHeader> header =
          wire::ParsePreallocationRouteHeader(message);
      if (!header.ok()) return std::nullopt;
      return header->session_id;
    }
    case wire::MessageKind::kDropped:
      break;
  }
  return std::nullopt;
}

absl::Status CheckOwner(const wire::Registration& registration, uint64_t arena_bytes,
                        const std::string& descriptor_endpoint,
                        const transport::RemoteRegions& regions) {
  const std::string claimed = wire::ReplyEndpoint(registration.endpoint, registration.port);
  if (descriptor_endpoint != claimed) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "registration of decode session %s refused: it names CachePD endpoint %s, but the "
        "session's own descriptor names %s; nothing of it is stored or written",
        registration.session_id, claimed,
        descriptor_endpoint.empty() ? "none" : descriptor_endpoint));
  }
  if (!regions.FindStartingAt(registration.arena_base, arena_bytes).has_value()) {
    const bool inside = regions.Find(registration.arena_base, 1).has_value();
    return absl::PermissionDeniedError(absl::StrFormat(
        "registration of decode session %s refused: its arena (base 0x%x, %d bytes) %s; "
        "nothing of it is stored or written",
        registration.session_id, registration.arena_base, arena_bytes,
        inside ? "begins inside a region of the session's descriptor, not at its beginning"
               : "is no region of the session's descriptor"));
  }
  return absl::OkStatus();
}

RegistrationGate::Check RegistrationGate::StartCheck(const std::string& session,
                                                     Message registration, Pending& pending) {
  pending.ticket = next_ticket_++;
  pending.registration = registration;
  return Check{pending.ticket, session, std::move(registration)};
}

void RegistrationGate::Route(const std::string& session, Message message,
                             std::optional<Message>& pass, absl::Status& refused) {
  auto owner = admitted_.find(session);
  const bool keyed = owner != admitted_.end() && !owner->second.key_digest.empty();
  if (wire::IsOwnerProof(message)) {
    // Consumed here: it goes no further. Without a digest to check it against it proves
    // nothing, and is dropped.
    if (!keyed) return;
    wire::OwnerProof proof = *wire::ParseOwnerProof(message);
    if (!SessionKey::Matches(proof.key, owner->second.key_digest)) {
      owner->second.proven.reset();
      refused = absl::PermissionDeniedError(absl::StrFormat(
          "owner proof of room %d naming decode session %s refused: its key is not the one "
          "whose digest the session's descriptor carries",
          proof.room, session));
      return;
    }
    owner->second.proven = proof.room;
    owner->second.key = std::move(proof.key);
    return;
  }
  if (keyed) {
    const uint64_t room = wire::ProvenRoomOf(message).value_or(0);
    const std::optional<uint64_t> proven = std::exchange(owner->second.proven, std::nullopt);
    if (proven != room) {
      refused = absl::PermissionDeniedError(absl::StrFormat(
          "%s of room %d naming decode session %s refused: no owner proof of that room came "
          "right before it, and the session's descriptor carries a key digest; nothing of it "
          "is stored",
          wire::IsFenceRequest(message)   ? "fence request"
          : wire::IsStagingOffer(message) ? "staging offer"
                                          : "pre-allocation",
          room, session));
      return;
    }
  }
  pass = std::move(message);
}

RegistrationGate::Admission RegistrationGate::Admit(Message message) {
  Admission out;
  bool is_registration = false;
  const std::optional<std::string> session = SessionOf(message, &is_registration);
  if (!session) {
    out.pass = std::move(message);
    return out;
  }
  auto pending = pending_.find(*session);
  if (pending != pending_.end()) {
    if (held_ >= max_held_) {
      out.refused = absl::ResourceExhaustedError(absl::StrFormat(
          "message of decode session %s dropped: %d messages already wait for registrations "
          "to be verified",
          *session, held_));
      return out;
    }
    pending->second.behind.push_back(std::move(message));
    ++held_;
    return out;
  }
  if (!is_registration) {
    Route(*session, std::move(message), out.pass, out.refused);
    return out;
  }
  auto admitted = admitted_.find(*session);
  if (admitted != admitted_.end() && admitted->second.registration == message) {
    out.pass = std::move(message);  // identical to the one verified: changes nothing (§3.2.2)
    return out;
  }
  out.check = StartCheck(*session, std::move(message), pending_[*session]);
  return out;
}

RegistrationGate::Release RegistrationGate::Verified(uint64_t ticket, bool ok,
                                                     const std::string& key_digest) {
  Release out;
  auto it = pending_.begin();
  while (it != pending_.end() && it->second.ticket != ticket) ++it;
  if (it == pending_.end()) return out;
  const std::string session = it->first;
  Pending& pending = it->second;
  if (ok) {
    absl::StatusOr<wire::ReplyRoute> route =
        wire::ParseRegistrationReplyRoute(pending.registration);
    admitted_[session] =
        Owner{pending.registration, key_digest, std::nullopt,
              route.ok() ? wire::ReplyEndpoint(route->endpoint, route->port) : std::string(), ""};
    out.pass.push_back(std::move(pending.registration));
  }
  while (!pending.behind.empty()) {
    Message message = std::move(pending.behind.front());
    pending.behind.pop_front();
    --held_;
    bool is_registration = false;
    (void)SessionOf(message, &is_registration);
    auto admitted = admitted_.find(session);
    if (is_registration) {
      if (admitted == admitted_.end() || admitted->second.registration != message) {
        out.next = StartCheck(session, std::move(message), pending);
        return out;
      }
      out.pass.push_back(std::move(message));
      continue;
    }
    std::optional<Message> pass;
    absl::Status refused;
    Route(session, std::move(message), pass, refused);
    if (pass) out.pass.push_back(*std::move(pass));
    if (!refused.ok()) out.refused.push_back(std::move(refused));
  }
  pending_.erase(it);
  return out;
}

void RegistrationGate::Forget(const std::string& session_id) { admitted_.erase(session_id); }

std::optional<std::string> RegistrationGate::KeyFor(const std::string& reply_endpoint) const {
  for (const auto& [session, owner] : admitted_) {
    if (owner.reply_endpoint == reply_endpoint && !owner.key.empty()) return owner.key;
  }
  return std::nullopt;
}

std::optional<std::string> RegistrationGate::KeyDigestOf(const std::string& session_id) const {
  auto owner = admitted_.find(session_id);
  if (owner == admitted_.end()) return std::nullopt;
  return owner->second.key_digest;
}

void RegistrationGate::ForgetUnless(const std::function<bool(const std::string&)>& keep) {
  for (auto it = admitted_.begin(); it != admitted_.end();) {
    it = keep(it->first) ? std::next(it) : admitted_.erase(it);
  }
}

}  // namespace kvrail::sidecar
