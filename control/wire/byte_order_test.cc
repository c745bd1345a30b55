#include "control/wire/byte_order.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace kvrail::wire {
namespace {

TEST(LittleEndian64Test, MatchesStructPackQOnX86) {
  // struct.pack("Q", 0x7f1234567000) on the reference's x86-64 host (frames.json).
  EXPECT_EQ(EncodeLittleEndian64(0x7f1234567000ULL),
            std::string("\x00\x70\x56\x34\x12\x7f\x00\x00", 8));
  EXPECT_EQ(DecodeLittleEndian64(std::string("\x01\0\0\0\0\0\0\0", 8)), 1u);
  EXPECT_EQ(DecodeLittleEndian64(std::string(8, '\xff')), std::numeric_limits<uint64_t>::max());
}

TEST(LittleEndian64Test, RoundTrips) {
  for (uint64_t value : {uint64_t{0}, uint64_t{1}, uint64_t{0x0102030405060708}, ~uint64_t{0}}) {
    EXPECT_EQ(DecodeLittleEndian64(EncodeLittleEndian64(value)), value);
  }
}

TEST(Int32ListTest, MatchesNumpyInt32ToBytes) {
  // numpy.array([7, 8, -1, 2**31 - 1], dtype=int32).tobytes() (status.json).
  const std::vector<int32_t> ids = {7, 8, -1, 2147483647};
  const std::string bytes("\x07\0\0\0\x08\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f", 16);
  EXPECT_EQ(EncodeInt32List(ids), bytes);
  EXPECT_EQ(DecodeInt32List(bytes), ids);
}

TEST(Int32ListTest, EmptyListIsEmptyBytes) {
  EXPECT_EQ(EncodeInt32List({}), "");
  EXPECT_TRUE(DecodeInt32List("").empty());
}

TEST(Int32ListTest, Int32Min) {
  EXPECT_EQ(DecodeInt32List(std::string("\0\0\0\x80", 4)),
            std::vector<int32_t>{std::numeric_limits<int32_t>::min()});
}

}  // namespace
}  // namespace kvrail::wire
