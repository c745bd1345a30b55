// Success only from the real sender (control/wire/proof.h): a decode sidecar takes a status
// (CACHEPD §3.4), a room digest (control/wire/digest.h) or a fence answer from a prefill node that
// proves its messages only right after a sender proof of the same room and rank whose tag, keyed
// with this decode's session key, matches that very message. A third party that can reach the
// decode's PULL socket cannot make a room Success (its bytes never sent) or release pages a prefill
// still writes.
//
// Pure: no sockets, threads or clocks. Not thread-safe (the sidecar's owner thread alone uses it).
#ifndef KVRAIL_CONTROL_SIDECAR_SENDER_CHECK_H_
#define KVRAIL_CONTROL_SIDECAR_SENDER_CHECK_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvrail::sidecar {

class SenderCheck {
 public:
  // `key`: this decode's session key. At most `max_kept` proofs wait for their message; past
  // that the oldest is forgotten.
  explicit SenderCheck(std::string key, size_t max_kept = 65536)
      : key_(std::move(key)), max_kept_(max_kept) {}

  // A sender proof arrived: kept for the message it vouches for. invalid-frame when it does not
  // parse.
  absl::Status OnProof(absl::Span<const std::string> frames);

  // A status, room digest or fence answer from a node that proves its messages: OK only when the
  // proof kept for its room and rank matches it (and is then used up); otherwise PermissionDenied
  // naming the room, the rank and what was missing.
  absl::Status Check(absl::Span<const std::string> message);

  size_t kept() const { return tags_.size(); }

 private:
  std::string key_;
  size_t max_kept_;
  std::map<std::pair<uint64_t, uint32_t>, std::string> tags_;  // (room, rank) -> tag
  std::deque<std::pair<uint64_t, uint32_t>> order_;            // oldest first
};

// The room and prefill rank a status, room digest, room outcome or fence answer names, if it
// parses that far.
// A prefill proves each message it names to a keyed session, the digest before a Success and
// the Success itself each with a proof of its own.
std::optional<std::pair<uint64_t, uint32_t>> RoomAndRank(absl::Span<const std::string> message);

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_SENDER_CHECK_H_
