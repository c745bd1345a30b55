// Frame counts, sizes and ranges of the CachePD ZMQ messages (CACHEPD §3.2 to §3.4).
#ifndef KVRAIL_CONTROL_WIRE_LIMITS_H_
#define KVRAIL_CONTROL_WIRE_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace kvrail::wire {

// Registration, Decode → Prefill (CACHEPD §3.2).
inline constexpr char kRegistrationMarker[] = "None";  // frame 0, exactly these 4 bytes
inline constexpr size_t kRegistrationFrameCount = 8;
inline constexpr size_t kMaxEndpointBytes = 255;
inline constexpr size_t kMaxContractBytes = 262144;
inline constexpr uint64_t kMaxDecodeTpSize = 1024;

// Shared by registration and pre-allocation (CACHEPD §3.2, §3.3).
inline constexpr size_t kMaxSessionIdBytes = 512;

// Pre-allocation, Decode → Prefill (CACHEPD §3.3).
inline constexpr size_t kPreallocationFrameCount = 3;
inline constexpr size_t kMaxManifestBytes = 2097152;

// A room is an unsigned integer below 2^63 (CACHEPD "Terminology", §3.3).
inline constexpr uint64_t kMaxRoom = 9223372036854775807ULL;

// Status, Prefill → Decode (CACHEPD §3.4, §7.1, §9.3; §12.9 for 6 and 7 frames).
inline constexpr size_t kStatusFrameCount = 5;            // the snapshot's form
inline constexpr size_t kStatusFrameCount2026_09 = 7;     // 2026-09: + cached tokens, logprob
inline constexpr size_t kCachedTokensFrameIndex = 5;      // §12.9 frame 5
inline constexpr size_t kBootstrapLogprobFrameIndex = 6;  // §12.9 frame 6
inline constexpr size_t kBootstrapLogprobBytes = 8;       // little-endian IEEE-754 double
// Cached tokens are prompt tokens, so the strict reader bounds them as manifests bound prompt
// lengths (layout::kMaxTokens, 2^48; control/wire cannot depend on control/layout).
inline constexpr int64_t kMaxCachedTokens = int64_t{1} << 48;
inline constexpr size_t kMinLenientStatusFrameCount = 3;
inline constexpr uint64_t kMaxTransferPoll = 5;  // TransferPoll codes are 0 (Failed) to 5 (Success)
inline constexpr uint64_t kMaxPrefillRank = 1023;
inline constexpr int64_t kNoBootstrapToken = -1;

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_LIMITS_H_
