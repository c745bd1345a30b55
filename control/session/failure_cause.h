// Why a room failed, as a value from a short fixed list: for engines (RoomEvent.cause, telling
// a retry worth making from one that is not) and for metrics labels (kvrail_rooms_total{cause}),
// which must never carry free text. The reason beside it stays the one line a person reads.
// Each place that fails a room names its cause; nothing is derived from the reason's words.
#ifndef KVRAIL_CONTROL_SESSION_FAILURE_CAUSE_H_
#define KVRAIL_CONTROL_SESSION_FAILURE_CAUSE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvrail::session {

enum class FailureCause {
  kNone,        // the room did not fail
  kAborted,     // an engine gave the room up (abort_room, a decode's fence request)
  kTimeout,     // a CACHEPD §7.4 timeout or another deadline ran out
  kPeerFailed,  // the peer rank reported Failed, died, or stopped answering
  kExpired,     // the peer's registry entry expired (--registry)
  kHandshake,   // the data-plane handshake or connect failed
  kTransport,   // a write failed on the data plane
  kBounds,      // a write fell outside the pages registered for the room
  kInvalid,     // a peer's message broke the protocol (bad metadata, an unexpected rank)
  kRefused,     // a peer or this sidecar refused the room (unregistered, not the owner)
  kDigest,      // the landed bytes did not match the source's digest (--verify-digest)
  kEngine,      // the engine side: its arena went, it re-attached, its staging failed
  kBootstrap,   // a bootstrap server could not be asked or refused a lookup
  kOther,
};

// The label: "aborted", "timeout", "peer_failed", "expired", "handshake", "transport", "bounds",
// "invalid", "refused", "digest", "engine", "bootstrap", "other"; "" for kNone.
absl::string_view FailureCauseLabel(FailureCause cause);

// The cause whose label is `label` (FailureCauseLabel); kOther for a word not in the list, kNone
// for "".
FailureCause FailureCauseFromLabel(absl::string_view label);

// The cause of a failed call by its status code, for failures that come as a Status from a
// layer that does not know rooms (the data plane, the planner): DeadlineExceeded is kTimeout,
// OutOfRange kBounds, InvalidArgument kInvalid, PermissionDenied, Unauthenticated and
// FailedPrecondition kRefused, Unavailable, Aborted, Internal and DataLoss kTransport,
// Cancelled kAborted (a transfer cancelled because its room failed), others kOther.
FailureCause FailureCauseOf(const absl::Status& status);

}  // namespace kvrail::session

#endif  // KVRAIL_CONTROL_SESSION_FAILURE_CAUSE_H_
