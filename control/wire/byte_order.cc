#include "control/wire/byte_order.h"

#include <cassert>
#include <cstddef>

namespace kvrail::wire {

std::string EncodeLittleEndian64(uint64_t value) {
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) {
    bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
  return bytes;
}

uint64_t DecodeLittleEndian64(absl::string_view bytes) {
  assert(bytes.size() == 8);
  uint64_t value = 0;
  for (size_t i = 0; i < 8; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

std::string EncodeInt32List(const std::vector<int32_t>& values) {
  std::string bytes;
  bytes.reserve(values.size() * 4);
  for (int32_t value : values) {
    const auto bits = static_cast<uint32_t>(value);
    for (size_t i = 0; i < 4; ++i) {
      bytes.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    }
  }
  return bytes;
}

std::vector<int32_t> DecodeInt32List(absl::string_view bytes) {
  assert(bytes.size() % 4 == 0);
  std::vector<int32_t> values;
  values.reserve(bytes.size() / 4);
  for (size_t offset = 0; offset + 4 <= bytes.size(); offset += 4) {
    uint32_t bits = 0;
    for (size_t i = 0; i < 4; ++i) {
      bits |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
    }
    values.push_back(static_cast<int32_t>(bits));
  }
  return values;
}

}  // namespace kvrail::wire
