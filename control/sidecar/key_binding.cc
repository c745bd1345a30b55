#include "control/sidecar/key_binding.h"

#include "absl/strings/str_cat.h"
#include "control/sidecar/registration_gate.h"
#include "control/sidecar/sender_check.h"
#include "control/wire/fence.h"
#include "control/wire/proof.h"
#include "control/wire/registration.h"

namespace kvrail::sidecar {
namespace {

using zmq_auth::KeyIdentity;
using zmq_auth::KeyRole;

absl::Status Refuse(const std::string& user_id, absl::string_view claim, absl::string_view rule) {
  return absl::PermissionDeniedError(
      absl::StrCat("key ", user_id, ": ", claim, " refused: ", rule, " (CURVE, docs/SECURITY.md)"));
}

}  // namespace

absl::StatusOr<KeyIdentity> KeyOf(const std::string& user_id) {
  if (user_id.empty()) {
    return absl::PermissionDeniedError(
        "a message without an authenticated key refused: CURVE is on (docs/SECURITY.md)");
  }
  absl::StatusOr<KeyIdentity> key = zmq_auth::ParseUserId(user_id);
  if (!key.ok()) return absl::PermissionDeniedError(key.status().message());
  return key;
}

absl::Status KeyBinding::CheckAtPrefill(const std::string& user_id,
                                        const std::vector<std::string>& message) {
  absl::StatusOr<KeyIdentity> key = KeyOf(user_id);
  if (!key.ok()) return key.status();
  if (key->role != KeyRole::kDecode) {
    return Refuse(user_id, "a message to a prefill", "only decode keys speak to a prefill");
  }
  bool registration = false;
  const std::optional<std::string> session = SessionOf(message, &registration);
  if (!session) return absl::OkStatus();  // the state machine refuses it and says why
  if (registration) {
    absl::StatusOr<wire::Registration> parsed =
        wire::ParseRegistration(message, [](absl::string_view) { return absl::OkStatus(); });
    if (parsed.ok() && parsed->decode_tp_rank != static_cast<uint32_t>(key->rank)) {
      return Refuse(user_id,
                    absl::StrCat("registration of session ", *session, " as decode TP rank ",
                                 parsed->decode_tp_rank),
                    "frame 7 (decode_tp_rank) must be the key's rank");
    }
    return absl::OkStatus();
  }
  auto owner = owners_.find(*session);
  if (owner != owners_.end() && owner->second == *key) return absl::OkStatus();
  for (const auto& [ticket, claimed] : claims_) {
    if (claimed.session == *session && claimed.key == *key) return absl::OkStatus();
  }
  if (owner == owners_.end()) {
    bool claimed = false;
    for (const auto& [ticket, c] : claims_) claimed = claimed || c.session == *session;
    if (!claimed) return absl::OkStatus();  // unregistered: the state machine answers it
  }
  return Refuse(user_id, absl::StrCat("a message naming decode session ", *session),
                owner != owners_.end()
                    ? absl::StrCat("the session belongs to key ", UserId(owner->second))
                    : "another key's registration of the session is being verified");
}

void KeyBinding::Claim(uint64_t ticket, const std::string& session, const KeyIdentity& key) {
  claims_[ticket] = Claimed{session, key};
}

const KeyIdentity* KeyBinding::Claimant(uint64_t ticket) const {
  auto it = claims_.find(ticket);
  return it == claims_.end() ? nullptr : &it->second.key;
}

void KeyBinding::Verified(uint64_t ticket, bool ok) {
  auto it = claims_.find(ticket);
  if (it == claims_.end()) return;
  if (ok) owners_[it->second.session] = it->second.key;
  claims_.erase(it);
}

const KeyIdentity* KeyBinding::OwnerOf(const std::string& session) const {
  auto it = owners_.find(session);
  return it == owners_.end() ? nullptr : &it->second;
}

void KeyBinding::Forget(const std::string& session) { owners_.erase(session); }

absl::Status KeyBinding::CheckAtDecode(const std::string& user_id,
                                       const std::vector<std::string>& message) {
  absl::StatusOr<KeyIdentity> key = KeyOf(user_id);
  if (!key.ok()) return key.status();
  if (key->role != KeyRole::kPrefill) {
    return Refuse(user_id, "a message to a decode", "only prefill keys speak to a decode");
  }
  std::optional<uint32_t> rank;
  absl::string_view what = "a status";
  if (wire::IsSenderProof(message)) {
    absl::StatusOr<wire::SenderProof> proof = wire::ParseSenderProof(message);
    if (proof.ok()) rank = proof->prefill_rank;
    what = "a sender proof";
  } else if (std::optional<std::pair<uint64_t, uint32_t>> id = RoomAndRank(message)) {
    rank = id->second;
    if (wire::IsFencedAnswer(message)) what = "a fence answer";
  }
  if (rank && *rank != static_cast<uint32_t>(key->rank)) {
    return Refuse(user_id, absl::StrCat(what, " claiming prefill rank ", *rank),
                  "the rank a frame carries must be the key's rank");
  }
  return absl::OkStatus();
}

}  // namespace kvrail::sidecar
