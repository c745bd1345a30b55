// The registration message, Decode → Prefill (CACHEPD §3.2): exactly 8 frames.
//
//   0 "None" | 1 endpoint | 2 port | 3 session id | 4 arena base (8 bytes, little-endian) |
//   5 contract wire | 6 decode_tp_size | 7 decode_tp_rank
//
// This package checks the frames; the contract bytes are opaque here and are judged by the
// caller's ContractCheck (the layout package's contract parser).
#ifndef KVRAIL_CONTROL_WIRE_REGISTRATION_H_
#define KVRAIL_CONTROL_WIRE_REGISTRATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

// A Decode rank's registration with one Prefill rank.
struct Registration {
  std::string endpoint;         // ASCII host/IP of the Decode's PULL socket, 1..255 bytes
  uint16_t port = 0;            // that socket's port, 1..65535
  std::string session_id;       // ASCII Mooncake session "<ip>:<rpc_port>", 1..512 bytes
  uint64_t arena_base = 0;      // the Decode arena's base pointer, nonzero
  std::string contract_wire;    // contract bytes as sent (CACHEPD §4), 1..262144 bytes
  uint32_t decode_tp_size = 0;  // 1..1024
  uint32_t decode_tp_rank = 0;  // 0..decode_tp_size-1
};

bool operator==(const Registration& a, const Registration& b);
bool operator!=(const Registration& a, const Registration& b);

// Frames 1 to 3 of a registration: where the Prefill answers, even when it rejects the rest.
struct ReplyRoute {
  std::string endpoint;
  uint16_t port = 0;
  std::string session_id;
};

// Where a Prefill sends status frames for a registration (CACHEPD §3.4): "tcp://" and the
// endpoint frame cut at its first ':', then ":<port>".
std::string ReplyEndpoint(absl::string_view endpoint, uint16_t port);

// A prefill rank's CachePD endpoint as the decode ranks that look it up name it:
// "tcp://<rank_ip>:<rank_port>" from its bootstrap record (CACHEPD §1.2). A decode probes it
// and names it so; the prefill's data plane calls itself so as a writer
// (transport::TransportSpec::writer_name), so that the decode may refuse it once it is gone.
std::string RankEndpoint(absl::string_view rank_ip, int rank_port);

bool operator==(const ReplyRoute& a, const ReplyRoute& b);
bool operator!=(const ReplyRoute& a, const ReplyRoute& b);

// Judges the contract frame (frame 5). Returns OK to accept it, or the reason it is rejected.
using ContractCheck = absl::FunctionRef<absl::Status(absl::string_view contract_wire)>;

// Reads the reply route of a registration (the reference's `route_header_from_zmq`), checking
// in the order of the CACHEPD §3.2 table: exactly 8 frames with frame 0 == "None"; frames 1
// and 3 ASCII; endpoint 1..255 bytes; session id 1..512 bytes; port canonical [1, 65535].
// Frames 4 to 7 are not looked at. Every error is invalid-frame and names the frame and rule.
absl::StatusOr<ReplyRoute> ParseRegistrationReplyRoute(absl::Span<const std::string> frames);

// Reads a whole registration (the reference's `from_zmq`), in the order of CACHEPD §3.2:
// the reply route as above; frame 4 exactly 8 bytes; frame 5 through `check_contract`; frame 6
// canonical [1, 1024]; frame 7 canonical [0, decode_tp_size - 1]; and last the arena base
// must be nonzero. `check_contract` is called at most once, and only when frames 0 to 4 pass.
//
// Frame errors are invalid-frame. An error from `check_contract` is returned with
// "registration frame 5 (contract): " in front of its message; its code and category are kept.
absl::StatusOr<Registration> ParseRegistration(absl::Span<const std::string> frames,
                                               ContractCheck check_contract);

// The 8 frames of `registration`, byte for byte what the reference sends: "None", endpoint,
// port in canonical decimal, session id, arena base as 8 little-endian bytes, the contract
// bytes as given, size and rank in canonical decimal.
//
// Fails, with an invalid-frame error prefixed "cannot build registration: ", when
// ParseRegistration would reject the frames with a contract check that only requires
// 1..262144 bytes; so a successful result always parses back to `registration`. The contract
// is otherwise not looked at: emitting its canonical form (CACHEPD §4.2) is the caller's job.
absl::StatusOr<std::vector<std::string>> BuildRegistration(const Registration& registration);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_REGISTRATION_H_
