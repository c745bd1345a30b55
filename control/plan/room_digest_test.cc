#include "control/plan/room_digest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "control/plan/copy_plan.h"

namespace kvrail::plan {
namespace {

// An arena of `bytes` distinct-looking bytes.
std::vector<uint8_t> Arena(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> arena(bytes);
  std::mt19937 random(seed);
  for (uint8_t& b : arena) b = static_cast<uint8_t>(random());
  return arena;
}

// 64 copies of 256 bytes: source pages in order, destination pages scattered.
CopyList Uncoalesced() {
  CopyList copies;
  for (uint64_t i = 0; i < 64; ++i) {
    const uint64_t page = (i * 37) % 64;  // a permutation of 0..63
    copies.push_back({i * 256, page * 256, 256});
  }
  return copies;
}

uint64_t Digest(CopyList copies, DigestSide side, const std::vector<uint8_t>& arena) {
  absl::StatusOr<uint64_t> digest = RoomDigest(copies, side, arena);
  EXPECT_TRUE(digest.ok()) << digest.status();
  return digest.value_or(0);
}

TEST(RoomDigestTest, CoalescedUncoalescedShuffledAndSlicedCopiesOfTheSameBytesAgree) {
  const std::vector<uint8_t> dst = Arena(64 * 256, 1);
  const uint64_t reference = Digest(Uncoalesced(), DigestSide::kDestination, dst);

  CopyList coalesced = Uncoalesced();
  std::sort(coalesced.begin(), coalesced.end(),
            [](const Copy& a, const Copy& b) { return a.dst_offset < b.dst_offset; });
  // Not source-adjacent, so coalesce in destination terms only: one copy for everything.
  CopyList whole = {{0, 0, 64 * 256}};
  CopyList shuffled = Uncoalesced();
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  CopyList sliced;  // every copy cut in four, as the scheduler's slices or lanes would
  for (const Copy& c : Uncoalesced()) {
    for (uint64_t s = 0; s < 4; ++s)
      sliced.push_back({c.src_offset + s * 64, c.dst_offset + s * 64, 64});
  }
  EXPECT_EQ(Digest(coalesced, DigestSide::kDestination, dst), reference);
  EXPECT_EQ(Digest(whole, DigestSide::kDestination, dst), reference);
  EXPECT_EQ(Digest(shuffled, DigestSide::kDestination, dst), reference);
  EXPECT_EQ(Digest(sliced, DigestSide::kDestination, dst), reference);
}

// Head-sliced rows (a prefill's half of each 512-byte destination row) as strided copies, a
// page of 8 rows each, against the same rows a copy each: one digest, and rows of two strided
// copies that interleave in the destination are hashed in destination order.
TEST(RoomDigestTest, StridedCopiesHashAsTheirRows) {
  const std::vector<uint8_t> src = Arena(64 * 512, 2);
  CopyList rows, strided, interleaved;
  for (uint64_t page = 0; page < 8; ++page) {
    strided.push_back({page * 8 * 512, page * 8 * 512, 256, 8, 512, 512});
    for (uint64_t r = 0; r < 8; ++r) {
      rows.push_back({(page * 8 + r) * 512, (page * 8 + r) * 512, 256});
    }
  }
  // The same rows cut differently: even rows of all pages, then odd rows (each a strided copy
  // whose destination span overlaps the other's, without a byte in common).
  interleaved.push_back({0, 0, 256, 32, 1024, 1024});
  interleaved.push_back({512, 512, 256, 32, 1024, 1024});
  const uint64_t reference = Digest(rows, DigestSide::kSource, src);
  EXPECT_EQ(Digest(strided, DigestSide::kSource, src), reference);
  EXPECT_EQ(Digest(interleaved, DigestSide::kSource, src), reference);
  // A strided copy whose rows write another's bytes is refused like any overlap.
  CopyList twice = strided;
  twice.push_back({0, 4 * 512, 256, 2, 512, 512});
  absl::StatusOr<uint64_t> refused = RoomDigest(twice, DigestSide::kSource, src);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "write the same destination bytes"))
      << refused.status();
  // Rows that overlap, or a span past 2^64, are refused before any byte is read.
  for (const Copy& bad :
       {Copy{0, 0, 256, 2, 128, 512}, Copy{0, 0, 256, uint64_t{1} << 62, 512, 512}}) {
    CopyList list = {bad};
    refused = RoomDigest(list, DigestSide::kSource, src);
    ASSERT_FALSE(refused.ok());
    EXPECT_TRUE(
        absl::StrContains(refused.status().message(), "has rows that overlap, or passes 2^64"))
        << refused.status();
  }
  // A row past the arena is refused, naming it.
  CopyList past = {{0, 0, 256, 65, 512, 512}};
  refused = RoomDigest(past, DigestSide::kSource, src);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "reaches past the source arena"))
      << refused.status();
}

TEST(RoomDigestTest, TheSourceSidesDigestEqualsTheDestinationsOnceEveryCopyLanded) {
  const std::vector<uint8_t> src = Arena(64 * 256, 2);
  std::vector<uint8_t> dst(64 * 256, 0);
  CopyList copies = Uncoalesced();
  for (const Copy& c : copies) std::copy_n(&src[c.src_offset], c.length, &dst[c.dst_offset]);
  CopyList coalesced = copies;
  Coalesce(coalesced);  // source-adjacent runs merge as the prefill's expansion merges them
  EXPECT_EQ(Digest(coalesced, DigestSide::kSource, src),
            Digest(copies, DigestSide::kDestination, dst));
}

TEST(RoomDigestTest, OneFlippedByteChangesTheDigest) {
  std::vector<uint8_t> dst = Arena(64 * 256, 3);
  const uint64_t before = Digest(Uncoalesced(), DigestSide::kDestination, dst);
  dst[37 * 256 + 11] ^= 0x01;
  EXPECT_NE(Digest(Uncoalesced(), DigestSide::kDestination, dst), before);
}

TEST(RoomDigestTest, BytesNoCopyWritesDoNotCount) {
  std::vector<uint8_t> dst = Arena(2 * 64 * 256, 4);
  const uint64_t before = Digest(Uncoalesced(), DigestSide::kDestination, dst);
  dst[64 * 256 + 5] ^= 0xff;  // past every copy
  EXPECT_EQ(Digest(Uncoalesced(), DigestSide::kDestination, dst), before);
}

TEST(RoomDigestTest, AnEmptyRoomHasTheDigestOfNoBytes) {
  CopyList none;
  const std::vector<uint8_t> arena = Arena(16, 5);
  EXPECT_EQ(Digest(none, DigestSide::kSource, arena), Digest(none, DigestSide::kDestination, {}));
}

TEST(RoomDigestTest, ACopyPastTheArenaIsRefusedNamingIt) {
  CopyList copies = {{0, 0, 16}, {16, 16, 17}};
  const std::vector<uint8_t> arena(32);
  absl::StatusOr<uint64_t> digest = RoomDigest(copies, DigestSide::kDestination, arena);
  ASSERT_FALSE(digest.ok());
  EXPECT_TRUE(absl::StrContains(digest.status().message(),
                                "copy {src 16, dst 16, 17 bytes} reaches past the destination "
                                "arena of 32 bytes"))
      << digest.status();
}

TEST(RoomDigestTest, CopiesThatWriteAByteTwiceAreRefusedNamingBoth) {
  CopyList copies = {{0, 64, 32}, {100, 80, 32}};
  const std::vector<uint8_t> arena(256);
  absl::StatusOr<uint64_t> digest = RoomDigest(copies, DigestSide::kDestination, arena);
  ASSERT_FALSE(digest.ok());
  EXPECT_TRUE(absl::StrContains(digest.status().message(),
                                "copies {src 0, dst 64, 32 bytes} and {src 100, dst 80, 32 "
                                "bytes} write the same destination bytes"))
      << digest.status();
}

TEST(RoomDigestTest, DigestsAreSpelledAsSixteenHexDigits) {
  EXPECT_EQ(FormatDigest(0x1234abcdULL), "0x000000001234abcd");
}

}  // namespace
}  // namespace kvrail::plan
