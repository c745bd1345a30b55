// Fixed-width binary integers inside frames.
//
// The reference packs them in the sender's native byte order (CACHEPD §3.2 frame 4, §3.4 frame
// 4). Every tokenspeed deployment is little-endian, so kvrail always reads and writes
// little-endian explicitly, whatever the host (CACHEPD §9.2).
#ifndef KVRAIL_CONTROL_WIRE_BYTE_ORDER_H_
#define KVRAIL_CONTROL_WIRE_BYTE_ORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvrail::wire {

// The 8 little-endian bytes of `value`.
std::string EncodeLittleEndian64(uint64_t value);

// The value of 8 little-endian bytes. Requires bytes.size() == 8.
uint64_t DecodeLittleEndian64(absl::string_view bytes);

// `values` as concatenated little-endian int32 (4 bytes each); empty for an empty list.
std::string EncodeInt32List(const std::vector<int32_t>& values);

// The int32 values of concatenated little-endian 4-byte groups. Requires bytes.size() % 4 == 0.
std::vector<int32_t> DecodeInt32List(absl::string_view bytes);

}  // namespace kvrail::wire

#endif  // KVRAIL_CONTROL_WIRE_BYTE_ORDER_H_
