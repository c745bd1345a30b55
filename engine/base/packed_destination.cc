#include "engine/base/packed_destination.h"

#include <utility>

namespace kvrail {

size_t PackDestinations(Copy* copies, size_t n, uint64_t& cursor) {
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    Copy c = copies[i];
    if (c.length == 0 || c.rows == 0) continue;
    if (c.rows > 1 && c.src_stride == c.length) c = {c.src_offset, 0, c.rows * c.length};
    c.dst_offset = cursor;
    c.dst_stride = c.rows > 1 ? c.length : 0;
    cursor += PayloadBytes(c);
    if (kept > 0 && c.rows == 1) {
      Copy& last = copies[kept - 1];
      if (last.rows == 1 && last.src_offset + last.length == c.src_offset) {
        last.length += c.length;  // both sides continue it
        continue;
      }
    }
    copies[kept++] = c;
  }
  return kept;
}

void PackDestinations(CopyList& copies) {
  uint64_t cursor = 0;
  copies.Truncate(PackDestinations(copies.begin(), copies.size(), cursor));
}

namespace {

class PackedDestination final : public CopySource {
 public:
  explicit PackedDestination(std::unique_ptr<CopySource> inner) : inner_(std::move(inner)) {
    envelope_ = inner_->envelope();
    envelope_.dst_begin = 0;
    envelope_.dst_end = envelope_.bytes;
  }

  CopyEnvelope envelope() const override { return envelope_; }

  size_t Next(Copy* out, size_t capacity) override {
    // Pulled into `out` itself, then packed in place: packing only ever shrinks the list. Pulls
    // again while every copy pulled was empty: 0 would say the source is done.
    while (true) {
      const size_t pulled = inner_->Next(out, capacity);
      if (pulled == 0) return 0;
      const size_t kept = PackDestinations(out, pulled, cursor_);
      if (kept > 0) return kept;
    }
  }

 private:
  std::unique_ptr<CopySource> inner_;
  CopyEnvelope envelope_;
  uint64_t cursor_ = 0;
};

}  // namespace

std::unique_ptr<CopySource> PackDestination(std::unique_ptr<CopySource> inner) {
  return std::make_unique<PackedDestination>(std::move(inner));
}

}  // namespace kvrail
