// kvrail's row staging messages beside CachePD (issue 31; docs/PROTOCOL.md, "Row staging"):
// a decode offers a room's prefill rank a slot of its staging memory, and the prefill rank says,
// before its Success, whether it wrote the room's rows there (back to back, for the decode to
// scatter into its pages before that Success counts) or into the pages themselves.
//
//   offer,  Decode → Prefill, right before the pre-allocation it belongs to, on the same route,
//           behind an owner proof of its own (proof.h), to a kvrail prefill node only:
//     0 kStagingOfferMagic | 1 room | 2 decode session id | 3 address | 4 bytes
//   answer, Prefill → Decode, right before the room's Success (CACHEPD §3.4) on the route of the
//           registration, proven as the Success is, to a kvrail decode session only:
//     0 kStagingAnswerMagic | 1 room | 2 prefill rank (the status's frame 2) | 3 "staged" or
//     "in_place"
//
// The address is where the slot begins in the decode's registered memory (a region of its
// session's descriptor), `bytes` its size: exactly the bytes that rank writes for the room. A
// prefill rank that takes the offer writes the room's rows into the slot in the plan's order
// (CACHEPD §6.9), each row right after the one before. Frame 0 starts with byte 0xFF
// (kvrail_frames.h); numbers are canonical decimal (§3.1).
#ifndef KVRAIL_CONTROL_WIRE_ROW_STAGING_H_
#define KVRAIL_CONTROL_WIRE_ROW_STAGING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvrail::wire {

inline constexpr absl::string_view kStagingOfferMagic = "\xffkvrail.staging.v1";
inline constexpr absl::string_view kStagingAnswerMagic = "\xffkvrail.staged.v1";

struct StagingOffer {
  uint64_t room = 0;
  std::string session_id;  // the decode's data-plane session (its registration's frame 3)
  uint64_t address = 0;    // the slot's first byte, in the decode's registered memory
  uint64_t bytes = 0;      // the slot's size: every byte the rank writes for the room
};

struct StagingAnswer {
  uint64_t room = 0;
  uint32_t prefill_rank = 0;  // as in the prefill's status frames (CACHEPD §3.4, §10.1)
  bool staged = false;        // true: the rows are in the slot; false: in the pages ("in_place")
};

bool IsStagingOffer(absl::Span<const std::string> frames);
bool IsStagingAnswer(absl::Span<const std::string> frames);

// invalid-frame naming the frame and rule: not 5 frames, another magic, a room that is not
// canonical decimal in [0, 2^63-1], a session id not of 1 to 512 bytes, an address or size not
// canonical decimal in [1, 2^64-1], or a slot whose end wraps around the address space.
absl::StatusOr<StagingOffer> ParseStagingOffer(absl::Span<const std::string> frames);
absl::StatusOr<std::vector<std::string>> BuildStagingOffer(const StagingOffer& offer);

// invalid-frame: not 4 frames, another magic, a room or rank not canonical decimal ([0,
// 2^63-1], [0, 1023]), frame 3 not "staged" or "in_place".
absl::StatusOr<StagingAnswer> ParseStagingAnswer(absl::Span<const std::string> frames);
absl::StatusOr<std::vector<std::string>> BuildStagingAnswer(const StagingAnswer& answer);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_ROW_STAGING_H_
