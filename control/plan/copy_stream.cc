#include "control/plan/copy_stream.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/base/error.h"

namespace kvrail::plan {

// Friend of CopyPlan and CopyCursor: the cursor over manifests it owns, and the envelope.
class CopyStream : public CopySource {
 public:
  CopyStream(std::shared_ptr<const CopyPlan> plan, std::shared_ptr<const layout::Manifest> src,
             std::shared_ptr<const layout::Manifest> dst, std::vector<char> mask, bool masked,
             bool coalesce, bool strided)
      : plan_(std::move(plan)),
        src_(std::move(src)),
        dst_(std::move(dst)),
        mask_(std::move(mask)),
        cursor_(plan_.get(), src_.get(), dst_.get(), coalesce, masked ? &mask_ : nullptr, strided) {
    envelope_ = Envelope(masked ? &mask_ : nullptr);
  }

  CopyEnvelope envelope() const override { return envelope_; }
  size_t Next(Copy* out, size_t capacity) override { return cursor_.Next(out, capacity); }

  static absl::StatusOr<std::unique_ptr<CopySource>> Make(
      std::shared_ptr<const CopyPlan> plan, std::shared_ptr<const layout::Manifest> src,
      std::shared_ptr<const layout::Manifest> dst, CopyPlan::LayerRange layers, bool coalesce,
      bool strided) {
    const bool masked = layers.begin > 0 || layers.end != INT64_MAX;
    if (masked) KVRAIL_RETURN_IF_ERROR(plan->layered());
    KVRAIL_RETURN_IF_ERROR(plan->CheckRoom(*src, *dst));
    std::vector<char> mask = masked ? plan->LayerMask(layers) : std::vector<char>();
    return std::make_unique<CopyStream>(std::move(plan), std::move(src), std::move(dst),
                                        std::move(mask), masked, coalesce, strided);
  }

 private:
  // Over the fragments the mask selects and the positions each sends, as the cursor walks
  // them: each position's rows span [page + 0, page + (rows - 1) * row_stride + bytes_per_row).
  // It runs between the engine's Ready and the room's first write, so it does not walk every
  // position of every fragment (64 fields of 1,024 pages at 16k tokens took about 0.7 ms): a
  // fragment that sends every position (no owner filter) reads page ids linearly, so its hull
  // follows from its group's least and greatest ids, found once per group. A page-sharded
  // fragment (§12.8) still walks its positions.
  CopyEnvelope Envelope(const std::vector<char>* mask) const {
    CopyEnvelope e;
    e.src_begin = e.dst_begin = UINT64_MAX;
    // Per group, over its positions: the least and greatest source and destination ids.
    struct Ids {
      bool found = false;
      int64_t src_lo = 0, src_hi = 0, dst_lo = 0, dst_hi = 0;
    };
    std::vector<Ids> ids(src_->groups.size());
    const auto add = [](int64_t lo, int64_t hi, int64_t span, int64_t bytes_per_row,
                        uint64_t& begin, uint64_t& end) {
      begin = std::min<uint64_t>(begin, lo + std::min<int64_t>(0, span));
      end = std::max<uint64_t>(end, hi + std::max<int64_t>(0, span) + bytes_per_row);
    };
    for (size_t f = 0; f < plan_->fragments_.size(); ++f) {
      if (mask != nullptr && (*mask)[f] == 0) continue;
      const BoundFragment& b = plan_->fragments_[f];
      const auto& s = src_->groups[b.group_index].block_ids;
      const auto& t = dst_->groups[b.group_index].block_ids;
      const int64_t src_span = (b.rows - 1) * b.src_row_stride;
      const int64_t dst_span = (b.rows - 1) * b.dst_row_stride;
      if (s.empty()) continue;
      if (b.owner.owner_count <= 1) {
        Ids& g = ids[b.group_index];
        if (!g.found) {
          const auto [src_lo, src_hi] = std::minmax_element(s.begin(), s.end());
          const auto [dst_lo, dst_hi] = std::minmax_element(t.begin(), t.end());
          g = {true, *src_lo, *src_hi, *dst_lo, *dst_hi};
        }
        // A page's offset is base + id * stride: least and greatest at the ends of the ids.
        const auto ends = [](int64_t base, int64_t stride, int64_t lo, int64_t hi) {
          const int64_t a = base + lo * stride, z = base + hi * stride;
          return std::pair<int64_t, int64_t>{std::min(a, z), std::max(a, z)};
        };
        const auto [sp_lo, sp_hi] = ends(b.src_base, b.src_page_stride, g.src_lo, g.src_hi);
        const auto [dp_lo, dp_hi] = ends(b.dst_base, b.dst_page_stride, g.dst_lo, g.dst_hi);
        add(sp_lo, sp_hi, src_span, b.bytes_per_row, e.src_begin, e.src_end);
        add(dp_lo, dp_hi, dst_span, b.bytes_per_row, e.dst_begin, e.dst_end);
        e.bytes += static_cast<uint64_t>(b.rows * b.bytes_per_row) * s.size();
        e.copies += static_cast<uint64_t>(b.rows) * s.size();
        continue;
      }
      for (size_t i = 0; i < s.size(); ++i) {
        if (!plan_->SendsPosition(b, *src_, i)) continue;
        const int64_t sp = b.src_base + CopyPlan::SourcePage(b, s[i]) * b.src_page_stride;
        const int64_t dp = b.dst_base + t[i] * b.dst_page_stride;
        add(sp, sp, src_span, b.bytes_per_row, e.src_begin, e.src_end);
        add(dp, dp, dst_span, b.bytes_per_row, e.dst_begin, e.dst_end);
        e.bytes += static_cast<uint64_t>(b.rows * b.bytes_per_row);
        e.copies += static_cast<uint64_t>(b.rows);
      }
    }
    if (e.copies == 0) e.src_begin = e.dst_begin = 0;
    return e;
  }

  const std::shared_ptr<const CopyPlan> plan_;
  const std::shared_ptr<const layout::Manifest> src_;
  const std::shared_ptr<const layout::Manifest> dst_;
  const std::vector<char> mask_;
  CopyCursor cursor_;
  CopyEnvelope envelope_;
};

absl::StatusOr<std::unique_ptr<CopySource>> StreamRoom(std::shared_ptr<const CopyPlan> plan,
                                                       std::shared_ptr<const layout::Manifest> src,
                                                       std::shared_ptr<const layout::Manifest> dst,
                                                       CopyPlan::LayerRange layers, bool coalesce,
                                                       bool strided) {
  return CopyStream::Make(std::move(plan), std::move(src), std::move(dst), layers, coalesce,
                          strided);
}

}  // namespace kvrail::plan
