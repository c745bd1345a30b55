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
  CopyEnvelope Envelope(const std::vector<char>* mask) const {
    CopyEnvelope e;
    e.src_begin = e.dst_begin = UINT64_MAX;
    for (size_t f = 0; f < plan_->fragments_.size(); ++f) {
      if (mask != nullptr && (*mask)[f] == 0) continue;
      const BoundFragment& b = plan_->fragments_[f];
      const auto& s = src_->groups[b.group_index].block_ids;
      const auto& t = dst_->groups[b.group_index].block_ids;
      const int64_t src_span = (b.rows - 1) * b.src_row_stride;
      const int64_t dst_span = (b.rows - 1) * b.dst_row_stride;
      for (size_t i = 0; i < s.size(); ++i) {
        if (!plan_->SendsPosition(b, *src_, i)) continue;
        const int64_t sp = b.src_base + CopyPlan::SourcePage(b, s[i]) * b.src_page_stride;
        const int64_t dp = b.dst_base + t[i] * b.dst_page_stride;
        e.src_begin = std::min<uint64_t>(e.src_begin, std::min(sp, sp + src_span));
        e.src_end = std::max<uint64_t>(e.src_end, std::max(sp, sp + src_span) + b.bytes_per_row);
        e.dst_begin = std::min<uint64_t>(e.dst_begin, std::min(dp, dp + dst_span));
        e.dst_end = std::max<uint64_t>(e.dst_end, std::max(dp, dp + dst_span) + b.bytes_per_row);
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
