#include "control/wire/registration.h"

#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "control/wire/ascii_uint.h"
#include "control/wire/byte_order.h"
#include "control/wire/frame_text.h"
#include "control/wire/limits.h"
#include "engine/base/error.h"

namespace kvrail::wire {
namespace {

constexpr absl::string_view kMarkerWhat = "registration frame 0 (marker)";
constexpr absl::string_view kEndpointWhat = "registration frame 1 (endpoint)";
constexpr absl::string_view kPortWhat = "registration frame 2 (port)";
constexpr absl::string_view kSessionWhat = "registration frame 3 (session id)";
constexpr absl::string_view kArenaBaseWhat = "registration frame 4 (arena base)";
constexpr absl::string_view kContractWhat = "registration frame 5 (contract)";
constexpr absl::string_view kSizeWhat = "registration frame 6 (decode_tp_size)";
constexpr absl::string_view kRankWhat = "registration frame 7 (decode_tp_rank)";

absl::Status FrameError(absl::string_view what, absl::string_view rule) {
  return MakeError(ErrorCategory::kInvalidFrame, absl::StrCat(what, ": ", rule, " (CACHEPD §3.2)"));
}

absl::Status RequireLength(absl::string_view frame, size_t max, absl::string_view what) {
  if (!frame.empty() && frame.size() <= max) {
    return absl::OkStatus();
  }
  return FrameError(what, absl::StrCat(frame.size(), " bytes, must be 1 to ", max));
}

// What frames 4, 6 and 7 carry; the strings are copied only once everything has passed.
struct Numbers {
  uint64_t arena_base = 0;
  uint32_t decode_tp_size = 0;
  uint32_t decode_tp_rank = 0;
};

// Frames 4 to 7, in the order of CACHEPD §3.2. Requires a parsed reply route (8 frames).
absl::StatusOr<Numbers> ParseFramesFourToSeven(absl::Span<const std::string> frames,
                                               ContractCheck check_contract) {
  Numbers numbers;
  if (frames[4].size() != 8) {
    return FrameError(kArenaBaseWhat,
                      absl::StrCat(frames[4].size(), " bytes, must be exactly 8 (u64 pointer)"));
  }
  numbers.arena_base = DecodeLittleEndian64(frames[4]);
  if (absl::Status contract = check_contract(frames[5]); !contract.ok()) {
    return AddContext(contract, kContractWhat);
  }
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t size,
                          ParseCanonicalUint(frames[6], 1, kMaxDecodeTpSize, kSizeWhat));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t rank,
                          ParseCanonicalUint(frames[7], 0, size - 1, kRankWhat));
  numbers.decode_tp_size = static_cast<uint32_t>(size);
  numbers.decode_tp_rank = static_cast<uint32_t>(rank);
  // The reference checks the pointer value only after frames 5 to 7 (CACHEPD §3.2).
  if (numbers.arena_base == 0) {
    return FrameError(kArenaBaseWhat, "pointer must be nonzero");
  }
  return numbers;
}

// The builder's stand-in for the contract parser; ParseFramesFourToSeven adds the frame name.
absl::Status CheckContractSize(absl::string_view contract_wire) {
  if (!contract_wire.empty() && contract_wire.size() <= kMaxContractBytes) {
    return absl::OkStatus();
  }
  return MakeError(ErrorCategory::kInvalidFrame,
                   absl::StrCat(contract_wire.size(), " bytes, must be 1 to ", kMaxContractBytes,
                                " (CACHEPD §3.2)"));
}

}  // namespace

bool operator==(const Registration& a, const Registration& b) {
  return a.endpoint == b.endpoint && a.port == b.port && a.session_id == b.session_id &&
         a.arena_base == b.arena_base && a.contract_wire == b.contract_wire &&
         a.decode_tp_size == b.decode_tp_size && a.decode_tp_rank == b.decode_tp_rank;
}

bool operator!=(const Registration& a, const Registration& b) { return !(a == b); }

std::string ReplyEndpoint(absl::string_view endpoint, uint16_t port) {
  const size_t colon = endpoint.find(':');
  if (colon != absl::string_view::npos) endpoint = endpoint.substr(0, colon);
  return absl::StrCat("tcp://", endpoint, ":", port);
}

std::string RankEndpoint(absl::string_view rank_ip, int rank_port) {
  return absl::StrCat("tcp://", rank_ip, ":", rank_port);
}

bool operator==(const ReplyRoute& a, const ReplyRoute& b) {
  return a.endpoint == b.endpoint && a.port == b.port && a.session_id == b.session_id;
}

bool operator!=(const ReplyRoute& a, const ReplyRoute& b) { return !(a == b); }

absl::StatusOr<ReplyRoute> ParseRegistrationReplyRoute(absl::Span<const std::string> frames) {
  if (frames.size() != kRegistrationFrameCount) {
    return MakeError(ErrorCategory::kInvalidFrame,
                     absl::StrCat("registration: got ", frames.size(),
                                  " frames, requires exactly 8 (CACHEPD §3.2)"));
  }
  if (frames[0] != kRegistrationMarker) {
    return FrameError(kMarkerWhat, absl::StrCat(QuoteFrame(frames[0]), " must be exactly \"",
                                                kRegistrationMarker, "\""));
  }
  KVRAIL_RETURN_IF_ERROR(RequireAscii(frames[1], kEndpointWhat, "§3.2"));
  KVRAIL_RETURN_IF_ERROR(RequireAscii(frames[3], kSessionWhat, "§3.2"));
  KVRAIL_RETURN_IF_ERROR(RequireLength(frames[1], kMaxEndpointBytes, kEndpointWhat));
  KVRAIL_RETURN_IF_ERROR(RequireLength(frames[3], kMaxSessionIdBytes, kSessionWhat));
  KVRAIL_ASSIGN_OR_RETURN(const uint64_t port, ParseCanonicalUint(frames[2], 1, 65535, kPortWhat));
  return ReplyRoute{frames[1], static_cast<uint16_t>(port), frames[3]};
}

absl::StatusOr<Registration> ParseRegistration(absl::Span<const std::string> frames,
                                               ContractCheck check_contract) {
  KVRAIL_ASSIGN_OR_RETURN(ReplyRoute route, ParseRegistrationReplyRoute(frames));
  KVRAIL_ASSIGN_OR_RETURN(const Numbers numbers, ParseFramesFourToSeven(frames, check_contract));
  Registration registration;
  registration.endpoint = std::move(route.endpoint);
  registration.port = route.port;
  registration.session_id = std::move(route.session_id);
  registration.arena_base = numbers.arena_base;
  registration.contract_wire = frames[5];
  registration.decode_tp_size = numbers.decode_tp_size;
  registration.decode_tp_rank = numbers.decode_tp_rank;
  return registration;
}

absl::StatusOr<std::vector<std::string>> BuildRegistration(const Registration& registration) {
  std::vector<std::string> frames = {
      kRegistrationMarker,
      registration.endpoint,
      FormatUint(registration.port),
      registration.session_id,
      EncodeLittleEndian64(registration.arena_base),
      registration.contract_wire,
      FormatUint(registration.decode_tp_size),
      FormatUint(registration.decode_tp_rank),
  };
  // Checking the frames themselves keeps the builder from ever emitting what the parser rejects.
  absl::Status valid = ParseRegistrationReplyRoute(frames).status();
  if (valid.ok()) {
    valid = ParseFramesFourToSeven(frames, CheckContractSize).status();
  }
  if (!valid.ok()) {
    return AddContext(valid, "cannot build registration");
  }
  return frames;
}

}  // namespace kvrail::wire
