#include "engine/base/packed_destination.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace kvrail {
namespace {

// A list as a source, `chunk` copies a pull at most.
class ListSource final : public CopySource {
 public:
  ListSource(std::vector<Copy> copies, size_t chunk) : copies_(std::move(copies)), chunk_(chunk) {
    for (const Copy& c : copies_) envelope_.bytes += PayloadBytes(c);
    envelope_.copies = copies_.size();
    envelope_.src_end = 1 << 20;
    envelope_.dst_begin = 4096;
    envelope_.dst_end = 1 << 20;
  }
  CopyEnvelope envelope() const override { return envelope_; }
  size_t Next(Copy* out, size_t capacity) override {
    const size_t n = std::min({capacity, chunk_, copies_.size() - next_});
    std::copy_n(copies_.begin() + next_, n, out);
    next_ += n;
    return n;
  }

 private:
  std::vector<Copy> copies_;
  size_t chunk_;
  size_t next_ = 0;
  CopyEnvelope envelope_;
};

std::vector<Copy> Drain(CopySource& source) {
  CopyList list;
  AppendAll(source, list);
  return std::vector<Copy>(list.begin(), list.end());
}

// The source byte each destination byte comes from, for every destination byte written.
std::vector<uint64_t> SourceOfEachByte(const std::vector<Copy>& copies, uint64_t bytes) {
  std::vector<uint64_t> from(bytes, UINT64_MAX);
  for (const Copy& c : copies) {
    ForEachRow(c, [&](uint64_t src, uint64_t dst, uint64_t length) {
      for (uint64_t i = 0; i < length; ++i) from.at(dst + i) = src + i;
    });
  }
  return from;
}

// A 2:1 room's shape: each page's rows back to back on the source and 2 KiB apart on the
// destination, then a source-strided page (a 1:2 room's), then a plain copy.
TEST(PackedDestinationTest, RowsLandBackToBackInTheirOrderAndTheEnvelopeFollows) {
  const std::vector<Copy> copies = {
      {0, 10240, 1024, 4, 1024, 2048},     // contiguous source: becomes one plain copy
      {4096, 20480, 1024, 4, 1024, 2048},  // continues the last on both sides: merged
      {65536, 30720, 512, 3, 1024, 512},   // strided source: stays rows
      {900000, 8192, 100},                 // plain
      {999, 0, 0},                         // empty: dropped
  };
  for (const size_t chunk : {size_t{1}, size_t{2}, size_t{64}}) {
    auto packed = PackDestination(std::make_unique<ListSource>(copies, chunk));
    const CopyEnvelope e = packed->envelope();
    EXPECT_EQ(e.bytes, 4096u + 4096 + 1536 + 100);
    EXPECT_EQ(e.dst_begin, 0u);
    EXPECT_EQ(e.dst_end, e.bytes);
    EXPECT_EQ(e.src_end, 1u << 20);
    EXPECT_EQ(e.copies, copies.size());
    const std::vector<Copy> out = Drain(*packed);
    // Byte i of the slot comes from the i-th source byte of the inner copies, in order.
    std::vector<uint64_t> expected;
    for (const Copy& c : copies) {
      ForEachRow(c, [&](uint64_t src, uint64_t, uint64_t length) {
        for (uint64_t i = 0; i < length; ++i) expected.push_back(src + i);
      });
    }
    EXPECT_EQ(SourceOfEachByte(out, e.bytes), expected) << "chunk " << chunk;
    if (chunk == 64) {
      ASSERT_EQ(out.size(), 3u);
      EXPECT_EQ(out[0], (Copy{0, 0, 8192}));
      EXPECT_EQ(out[1], (Copy{65536, 8192, 512, 3, 1024, 512}));
      EXPECT_EQ(out[2], (Copy{900000, 9728, 100}));
    }
  }
}

TEST(PackedDestinationTest, AListIsPackedInPlaceAsTheSourceWouldBe) {
  CopyList list = {{0, 10240, 1024, 4, 1024, 2048}, {7, 3, 0}, {65536, 30720, 512, 3, 1024, 512}};
  PackDestinations(list);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0], (Copy{0, 0, 4096}));
  EXPECT_EQ(list[1], (Copy{65536, 4096, 512, 3, 1024, 512}));
}

TEST(PackedDestinationTest, AnEmptySourceIsDoneAtOnce) {
  auto packed = PackDestination(std::make_unique<ListSource>(std::vector<Copy>{{1, 2, 0}}, 1));
  Copy out[4];
  EXPECT_EQ(packed->Next(out, 4), 0u);
  EXPECT_EQ(packed->envelope().bytes, 0u);
}

}  // namespace
}  // namespace kvrail
