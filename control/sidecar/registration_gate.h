// Writes bound to their owner: a prefill sidecar admits a decode's registration (CACHEPD
// §3.2.2) only once the data-plane descriptor fetched from that session's own handshake
// endpoint vouches for it: the descriptor names the registration's CachePD endpoint (frames 1
// and 2) and lists a region that begins at the registration's arena base (frame 4) and holds
// the contract's whole arena. A registration that names another decode's session, a base
// inside another region, or a reply endpoint that is not the session's own is refused, and
// nothing of it is stored: no room of it can write anything (docs/SECURITY.md).
//
// The gate sits between the CachePD inbox and PrefillRooms. A registration whose exact frames
// were admitted before passes at once; any other is held while the sidecar fetches the
// session's descriptor (in that session's strand), and so is every later message naming that
// session (pre-allocations, fence requests), in order, so that the registration still comes
// before the pre-allocations that rely on it (§1.3). Other sessions' messages pass meanwhile.
// Messages held are bounded: past the bound a session's messages are refused.
//
// Pre-allocations and fence requests bound to their owner, too (control/wire/proof.h): when the
// descriptor that admitted a session carries a key digest (a kvrail decode), a pre-allocation
// or fence request naming that session passes only right after an owner proof of the same room
// whose key matches the digest; the proofs themselves go no further. A session whose
// descriptor has no digest (a peer that is not kvrail) keeps CachePD's rules.
//
// Pure: no sockets, threads or clocks. Not thread-safe (the sidecar's owner thread alone uses it).
#ifndef KVRAIL_CONTROL_SIDECAR_REGISTRATION_GATE_H_
#define KVRAIL_CONTROL_SIDECAR_REGISTRATION_GATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "control/wire/registration.h"
#include "engine/transport/bounds.h"

namespace kvrail::sidecar {

// OK when `descriptor_endpoint` and `regions` (of the descriptor fetched from the session of
// `registration`) vouch for it, as above; otherwise PermissionDenied naming the session, the
// claim and what the descriptor says. `arena_bytes` is the registration's contract's arena.
absl::Status CheckOwner(const wire::Registration& registration, uint64_t arena_bytes,
                        const std::string& descriptor_endpoint,
                        const transport::RemoteRegions& regions);

// The session a message names, if it names one: a registration's frame 2, a pre-allocation's
// frame 1, an owner proof's or fence request's session frame; `is_registration` says whether
// it is a registration. nullopt for what does not parse that far (the state machine refuses
// it and says why).
std::optional<std::string> SessionOf(const std::vector<std::string>& message,
                                     bool* is_registration);

class RegistrationGate {
 public:
  using Message = std::vector<std::string>;

  // A registration to verify before it is handed on.
  struct Check {
    uint64_t ticket = 0;
    std::string session_id;
    Message registration;  // the frames, to parse again off the inbox thread
  };

  // What to do with one message from the inbox.
  struct Admission {
    std::optional<Message> pass;  // hand this on now
    std::optional<Check> check;   // verify this registration, then call Verified
    absl::Status refused;         // not OK: the message was dropped, and why
  };

  explicit RegistrationGate(size_t max_held = 4096) : max_held_(max_held) {}

  Admission Admit(Message message);

  // The check of `ticket` ended: `ok` hands on the registration and the messages held behind
  // it (`key_digest`: the descriptor's, empty for none); otherwise the registration is dropped
  // and the messages behind it are handed on alone (a pre-allocation of a session that is not
  // registered is answered Failed, §3.3). When another registration of the session was held
  // behind, it is not handed on: `next` is its check, and what follows it stays held.
  struct Release {
    std::vector<Message> pass;
    std::optional<Check> next;
    std::vector<absl::Status> refused;  // messages behind it that were dropped, and why
  };
  Release Verified(uint64_t ticket, bool ok, const std::string& key_digest = "");

  // The session was dropped: a later registration of it is checked again.
  void Forget(const std::string& session_id);
  // Forgets the admitted sessions for which `keep` is false (the state machine no longer holds
  // their registration: it refused it, or dropped it).
  void ForgetUnless(const std::function<bool(const std::string&)>& keep);

  // The session key of the keyed session whose registration answers to `reply_endpoint`, once
  // one of its owner proofs matched: what the prefill's sender proofs to it are keyed with.
  std::optional<std::string> KeyFor(const std::string& reply_endpoint) const;

  // The key digest the admitted registration of `session_id` was verified with (empty for a
  // peer that is not kvrail); nullopt when none is admitted. A descriptor served under the
  // session with another digest comes from another process: the one verified is gone.
  std::optional<std::string> KeyDigestOf(const std::string& session_id) const;

  size_t held() const { return held_; }
  size_t admitted() const { return admitted_.size(); }

 private:
  struct Pending {
    uint64_t ticket = 0;
    Message registration;
    std::deque<Message> behind;
  };
  struct Owner {
    Message registration;            // the last registration admitted
    std::string key_digest;          // the descriptor's; empty for a peer that is not kvrail
    std::optional<uint64_t> proven;  // the room of the owner proof just received
    std::string reply_endpoint;      // where the registration's status frames go (§3.4)
    std::string key;                 // the session key, once an owner proof matched
  };
  Check StartCheck(const std::string& session, Message registration, Pending& pending);
  // A message of a session with nothing pending: handed on, consumed (an owner proof), or
  // refused. Not a registration.
  void Route(const std::string& session, Message message, std::optional<Message>& pass,
             absl::Status& refused);

  size_t max_held_;
  size_t held_ = 0;
  uint64_t next_ticket_ = 1;
  std::map<std::string, Pending> pending_;  // by session id
  std::map<std::string, Owner> admitted_;   // by session id
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_REGISTRATION_GATE_H_
