// Messages bound to the CURVE key that sent them (docs/SECURITY.md, "Authentication (CURVE)").
// With CURVE on, every CachePD message comes with its connection's User-Id, "<role>:<rank>:
// <name>" (engine/zmq_auth/key_file.h); the sidecar checks it here before a message reaches
// the registration gate or a state machine:
//
//   on a prefill: registrations, pre-allocations, owner proofs and fence requests come from a
//   decode key; a registration's decode_tp_rank (frame 7) is the key's rank; a message naming
//   a session comes from the key whose registration of it was verified (its owner), or from a
//   key whose registration of it is being verified;
//   on a decode: statuses, sender proofs and fence answers come from a prefill key whose rank
//   is the rank the frame carries (the status rank: pp_rank * tp_size + tp_rank within the DP
//   group, CACHEPD §3.4, §10.1).
//
// Pure: no sockets, threads or clocks. Not thread-safe (the sidecar's owner thread alone uses it).
#ifndef KVRAIL_CONTROL_SIDECAR_KEY_BINDING_H_
#define KVRAIL_CONTROL_SIDECAR_KEY_BINDING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/zmq_auth/key_file.h"

namespace kvrail::sidecar {

class KeyBinding {
 public:
  // Prefill. OK when `user_id` may send `message`; PermissionDenied naming the key, the claim
  // and the rule otherwise (nothing is recorded then). A registration that will be verified
  // under `ticket` (RegistrationGate::Check) is recorded as a claim: call Verified after.
  absl::Status CheckAtPrefill(const std::string& user_id, const std::vector<std::string>& message);
  // The registration just checked (CheckAtPrefill) is being verified under `ticket`.
  void Claim(uint64_t ticket, const std::string& session, const zmq_auth::KeyIdentity& key);
  // The key that claimed `ticket`, while it is being verified.
  const zmq_auth::KeyIdentity* Claimant(uint64_t ticket) const;
  // Verification of `ticket` ended: `ok` makes its key the session's owner.
  void Verified(uint64_t ticket, bool ok);
  // The key whose registration of `session` was verified, or nullptr.
  const zmq_auth::KeyIdentity* OwnerOf(const std::string& session) const;
  void Forget(const std::string& session);

  // Decode. OK when `user_id` may send `message`; PermissionDenied otherwise.
  static absl::Status CheckAtDecode(const std::string& user_id,
                                    const std::vector<std::string>& message);

  size_t sessions() const { return owners_.size(); }

 private:
  struct Claimed {
    std::string session;
    zmq_auth::KeyIdentity key;
  };
  std::map<std::string, zmq_auth::KeyIdentity> owners_;  // by session
  std::map<uint64_t, Claimed> claims_;                   // by ticket, while verified
};

// The identity `user_id` names; PermissionDenied when it names none (no CURVE on that
// connection) or does not read.
absl::StatusOr<zmq_auth::KeyIdentity> KeyOf(const std::string& user_id);

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_KEY_BINDING_H_
