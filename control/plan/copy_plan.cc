#include "control/plan/copy_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

absl::Status BindError(absl::string_view problem) {
  return MakeError(ErrorCategory::kUnsupportedLayout,
                   absl::StrCat("address resolution: ", problem, " (CACHEPD §6.9)"));
}

absl::Status RoomError(absl::string_view problem) {
  return MakeError(ErrorCategory::kInvalidManifest,
                   absl::StrCat("room manifests: ", problem, " (CACHEPD §6.9)"));
}

absl::StatusOr<BoundFragment> BindOne(const layout::Contract& src, const layout::Contract& dst,
                                      int group_index, const std::string& field_id,
                                      const Fragment* fragment) {
  const layout::FieldLayout* sf = src.FindField(field_id);
  const layout::FieldLayout* df = dst.FindField(field_id);
  if (sf == nullptr || df == nullptr) {
    return BindError(absl::StrCat("field '", field_id, "' is missing from the ",
                                  sf == nullptr ? "prefill" : "decode", " contract"));
  }
  KVRAIL_ASSIGN_OR_RETURN(int64_t src_zero, layout::PageOffset(src, *sf, 0));
  KVRAIL_ASSIGN_OR_RETURN(int64_t dst_zero, layout::PageOffset(dst, *df, 0));
  // The last page must be addressable too; this bounds every product Expand computes.
  KVRAIL_RETURN_IF_ERROR(
      layout::PageOffset(src, *sf, src.FindGroup(sf->group_id)->page_count - 1).status());
  KVRAIL_RETURN_IF_ERROR(
      layout::PageOffset(dst, *df, dst.FindGroup(df->group_id)->page_count - 1).status());
  BoundFragment b;
  b.group_index = group_index;
  b.src_page_stride = sf->page_stride_bytes;
  b.dst_page_stride = df->page_stride_bytes;
  if (fragment == nullptr) {
    // Whole field (§6.9, P == D): the source payload, page to page.
    b.src_base = src_zero;
    b.dst_base = dst_zero;
    b.bytes_per_row = layout::PayloadBytes(*sf);
    b.src_row_stride = b.dst_row_stride = b.bytes_per_row;
    b.rows = 1;
    if (b.bytes_per_row > layout::PayloadBytes(*df)) {
      return BindError(absl::StrCat("field '", field_id, "' holds ", b.bytes_per_row,
                                    " bytes per page on the prefill but ",
                                    layout::PayloadBytes(*df), " on the decode"));
    }
    return b;
  }
  const Fragment& f = *fragment;
  if (f.rows_per_page < 1 || f.bytes_per_row < 1 || f.src_byte_offset < 0 ||
      f.dst_byte_offset < 0) {
    return BindError(absl::StrCat("fragment of field '", field_id, "' is empty or negative"));
  }
  // The last byte the fragment touches in a page must lie inside that side's payload.
  auto span = [&f](int64_t offset, int64_t stride) {
    return offset + (f.rows_per_page - 1) * stride + f.bytes_per_row;
  };
  if (span(f.src_byte_offset, f.src_row_stride_bytes) > layout::PayloadBytes(*sf) ||
      span(f.dst_byte_offset, f.dst_row_stride_bytes) > layout::PayloadBytes(*df)) {
    return BindError(
        absl::StrCat("fragment of field '", field_id, "' reaches past the page payload"));
  }
  b.src_base = src_zero + f.src_byte_offset;
  b.dst_base = dst_zero + f.dst_byte_offset;
  b.src_row_stride = f.src_row_stride_bytes;
  b.dst_row_stride = f.dst_row_stride_bytes;
  b.bytes_per_row = f.bytes_per_row;
  b.rows = f.rows_per_page;
  return b;
}

}  // namespace

absl::StatusOr<CopyPlan> CopyPlan::Bind(const layout::Contract& src, const layout::Contract& dst,
                                        absl::Span<const Fragment> fragments,
                                        absl::Span<const GroupOwnerFilter> owner_filters) {
  KVRAIL_RETURN_IF_ERROR(AddContext(
      ValidateOwnerDecisions(fragments, owner_filters, src.group_specs), "address resolution"));
  CopyPlan plan;
  plan.group_count_ = src.group_specs.size();
  for (const layout::GroupSpec& spec : src.group_specs) {
    const layout::GroupLayout* s = src.FindGroup(spec.group_id);
    const layout::GroupLayout* d = dst.FindGroup(spec.group_id);
    if (d == nullptr) return BindError(absl::StrCat("decode has no group '", spec.group_id, "'"));
    plan.group_pages_.emplace_back(src.VirtualBlockCount(*s), d->page_count);
  }
  plan.whole_field_ = fragments.empty();
  if (dst.group_specs.size() != src.group_specs.size()) {
    return BindError("the contracts have different group lists");
  }
  for (size_t g = 0; g < src.group_specs.size(); ++g) {
    const std::string& group_id = src.group_specs[g].group_id;
    const OwnerFilter* owner = FindOwnerFilter(owner_filters, group_id);
    const size_t first = plan.fragments_.size();
    if (plan.whole_field_) {
      for (const layout::FieldLayout* field : src.FieldsOfGroup(group_id)) {
        KVRAIL_ASSIGN_OR_RETURN(BoundFragment b,
                                BindOne(src, dst, static_cast<int>(g), field->field_id, nullptr));
        plan.fragments_.push_back(b);
        plan.fragment_fields_.push_back(field->field_id);
      }
    } else {
      for (const Fragment& fragment : fragments) {
        if (fragment.group_id != group_id) {
          continue;
        }
        KVRAIL_ASSIGN_OR_RETURN(
            BoundFragment b, BindOne(src, dst, static_cast<int>(g), fragment.field_id, &fragment));
        plan.fragments_.push_back(b);
        plan.fragment_fields_.push_back(fragment.field_id);
      }
    }
    if (owner != nullptr) {
      for (size_t i = first; i < plan.fragments_.size(); ++i) {
        plan.fragments_[i].owner = *owner;
      }
    }
  }
  for (const std::string& field : plan.fragment_fields_) {
    absl::StatusOr<int64_t> layer = FieldLayer(field);
    plan.fragment_layers_.push_back(layer.ok() ? *layer : -1);
    if (!layer.ok() && plan.layered_.ok()) {
      plan.layered_ = absl::FailedPreconditionError(layer.status().message());
    }
  }
  for (const Fragment& fragment : fragments) {
    if (src.FindGroupSpec(fragment.group_id) == nullptr) {
      return BindError(absl::StrCat("fragment names unknown group '", fragment.group_id, "'"));
    }
  }
  return plan;
}

bool CopyPlan::SendsPosition(const BoundFragment& fragment, const layout::Manifest& room,
                             size_t position) const {
  if (fragment.owner.owner_count <= 1) return true;
  return fragment.owner.Owns(room.groups[fragment.group_index].block_ids[position]);
}

int64_t CopyPlan::CountCopies(const layout::Manifest& src) const {
  return CountMasked(src, nullptr);
}

int64_t CopyPlan::CountMasked(const layout::Manifest& src, const std::vector<char>* mask) const {
  int64_t count = 0;
  for (size_t f = 0; f < fragments_.size(); ++f) {
    const BoundFragment& b = fragments_[f];
    if (mask != nullptr && (*mask)[f] == 0) continue;
    if (b.group_index >= static_cast<int>(src.groups.size())) continue;
    const size_t blocks = src.groups[b.group_index].block_ids.size();
    if (b.owner.owner_count <= 1) {
      count += b.rows * static_cast<int64_t>(blocks);
      continue;
    }
    for (size_t i = 0; i < blocks; ++i) count += SendsPosition(b, src, i) ? b.rows : 0;
  }
  return count;
}

absl::Status CopyPlan::Expand(const layout::Manifest& src, const layout::Manifest& dst,
                              CopyList& out) const {
  return ExpandInto(src, dst, out, /*coalesce=*/false);
}

absl::Status CopyPlan::ExpandCoalesced(const layout::Manifest& src, const layout::Manifest& dst,
                                       CopyList& out) const {
  return ExpandInto(src, dst, out, /*coalesce=*/true);
}

absl::Status CopyPlan::CheckRoom(const layout::Manifest& src, const layout::Manifest& dst) const {
  if (src.groups.size() != group_count_ || dst.groups.size() != group_count_) {
    return RoomError(absl::StrCat("expected ", group_count_, " groups, got ", src.groups.size(),
                                  " (source) and ", dst.groups.size(), " (destination)"));
  }
  // Check everything first, so that a bad room appends nothing.
  for (size_t g = 0; g < group_count_; ++g) {
    if (src.groups[g].group_id != dst.groups[g].group_id ||
        src.groups[g].block_ids.size() != dst.groups[g].block_ids.size()) {
      return RoomError(
          absl::StrCat("group ", g, " ('", src.groups[g].group_id, "' and '",
                       dst.groups[g].group_id, "') does not pair: ", src.groups[g].block_ids.size(),
                       " source and ", dst.groups[g].block_ids.size(), " destination blocks"));
    }
  }
  for (size_t g = 0; g < group_count_; ++g) {
    const auto& s = src.groups[g].block_ids;
    const auto& t = dst.groups[g].block_ids;
    const auto [src_pages, dst_pages] = group_pages_[g];
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] <= 0 || s[i] >= src_pages || t[i] <= 0 || t[i] >= dst_pages) {
        return RoomError(absl::StrCat("group '", src.groups[g].group_id, "' position ", i,
                                      " pairs block ", s[i], " with block ", t[i],
                                      "; pages are 1..", src_pages - 1, " and 1..", dst_pages - 1));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyCursor> CopyPlan::Begin(const layout::Manifest& src, const layout::Manifest& dst,
                                           bool coalesce, bool strided) const {
  KVRAIL_RETURN_IF_ERROR(CheckRoom(src, dst));
  return CopyCursor(this, &src, &dst, coalesce, nullptr, strided);
}

absl::Status CopyPlan::ExpandInto(const layout::Manifest& src, const layout::Manifest& dst,
                                  CopyList& out, bool coalesce) const {
  KVRAIL_RETURN_IF_ERROR(CheckRoom(src, dst));
  Drain(src, dst, coalesce, nullptr, out);
  return absl::OkStatus();
}

void CopyPlan::Drain(const layout::Manifest& src, const layout::Manifest& dst, bool coalesce,
                     const std::vector<char>* mask, CopyList& out) const {
  CopyCursor cursor(this, &src, &dst, coalesce, mask);
  const size_t base = out.size();
  const size_t most = static_cast<size_t>(CountMasked(src, mask));
  out.Truncate(base + cursor.Next(out.Extend(most), most));
}

std::vector<char> CopyPlan::LayerMask(LayerRange layers) const {
  std::vector<char> mask(fragments_.size(), 0);
  for (size_t f = 0; f < fragments_.size(); ++f) {
    mask[f] = fragment_layers_[f] >= layers.begin && fragment_layers_[f] < layers.end ? 1 : 0;
  }
  return mask;
}

absl::Status CopyPlan::ExpandLayers(const layout::Manifest& src, const layout::Manifest& dst,
                                    LayerRange layers, bool coalesce, CopyList& out) const {
  KVRAIL_RETURN_IF_ERROR(layered_);
  KVRAIL_RETURN_IF_ERROR(CheckRoom(src, dst));
  const std::vector<char> mask = LayerMask(layers);
  Drain(src, dst, coalesce, &mask, out);
  return absl::OkStatus();
}

absl::Status CopyPlan::ExpandChunk(absl::Span<const GroupSelection> selection,
                                   absl::Span<const std::string> field_ids,
                                   const layout::Manifest& dst, CopyList& out) const {
  if (selection.size() != group_count_ || dst.groups.size() != group_count_) {
    return RoomError(absl::StrCat("a chunk needs a selection and manifest entry per group (",
                                  group_count_, ")"));
  }
  for (const BoundFragment& b : fragments_) {
    if (b.owner.owner_count > 1) {
      return BindError("layerwise chunks do not combine with owner filters (CACHEPD §12.8)");
    }
  }
  // The chunk as a pair of manifests: source blocks as selected, destination blocks at the
  // selected positions of the decode manifest.
  layout::Manifest src_chunk{{}, dst.prefix_len, dst.prompt_len};
  layout::Manifest dst_chunk{{}, dst.prefix_len, dst.prompt_len};
  for (size_t g = 0; g < group_count_; ++g) {
    const GroupSelection& sel = selection[g];
    if (sel.source_block_ids.size() != sel.destination_positions.size()) {
      return RoomError(absl::StrCat("selection of group '", sel.group_id, "' pairs ",
                                    sel.source_block_ids.size(), " blocks with ",
                                    sel.destination_positions.size(), " positions"));
    }
    src_chunk.groups.push_back({sel.group_id, sel.source_block_ids});
    layout::ManifestGroup to{dst.groups[g].group_id, {}};
    for (int64_t position : sel.destination_positions) {
      if (position < 0 || position >= static_cast<int64_t>(dst.groups[g].block_ids.size())) {
        return RoomError(absl::StrCat("selection of group '", sel.group_id, "' names position ",
                                      position, " beyond the decode manifest"));
      }
      to.block_ids.push_back(dst.groups[g].block_ids[position]);
    }
    dst_chunk.groups.push_back(std::move(to));
  }
  KVRAIL_RETURN_IF_ERROR(CheckRoom(src_chunk, dst_chunk));
  std::vector<char> mask(fragments_.size(), 0);
  for (size_t f = 0; f < fragments_.size(); ++f) {
    const bool selected =
        std::find(field_ids.begin(), field_ids.end(), fragment_fields_[f]) != field_ids.end();
    mask[f] = selected ? 1 : 0;
  }
  Drain(src_chunk, dst_chunk, /*coalesce=*/true, &mask, out);
  return absl::OkStatus();
}

CopyCursor::CopyCursor(const CopyPlan* plan, const layout::Manifest* src,
                       const layout::Manifest* dst, bool coalesce,
                       const std::vector<char>* fragment_mask, bool strided)
    : plan_(plan),
      src_(src),
      dst_(dst),
      coalesce_(coalesce),
      fragment_mask_(fragment_mask),
      strided_(strided) {
  EnterFragment();
}

void CopyCursor::EnterFragment() {
  position_ = 0;
  row_ = 0;
}

size_t CopyCursor::Next(Copy* out, size_t capacity) {
  return coalesce_ ? Fill<true>(out, capacity) : Fill<false>(out, capacity);
}

// The hot loop. Everything it reads per copy sits in locals; the run being coalesced too, so
// merging adds no load-store dependency between consecutive copies.
template <bool kCoalesce>
size_t CopyCursor::Fill(Copy* __restrict out, size_t capacity) {
  size_t n = 0;
  const auto& fragments = plan_->fragments_;
  Copy run = run_;
  // Emits `copy`; false when the batch is full and `copy` was not consumed.
  // Forced inline: called from two loops, and left out of line `run` would live in memory.
  auto emit = [&](const Copy& copy) __attribute__((always_inline)) {
    if constexpr (kCoalesce) {
      if (run.length != 0 && run.rows == 1 && copy.rows == 1 &&
          run.src_offset + run.length == copy.src_offset &&
          run.dst_offset + run.length == copy.dst_offset &&
          run.length + copy.length <= kMostMergedBytes) {
        run.length += copy.length;
        return true;
      }
      // A strided copy that goes on where the run's rows end, with the same rows and strides
      // (the next page of a head-sliced field, when both sides' pages follow each other): more
      // rows of the run, up to kMostMergedBytes of them.
      if (run.length != 0 && run.rows > 1 && copy.rows > 1 && run.length == copy.length &&
          run.src_stride == copy.src_stride && run.dst_stride == copy.dst_stride &&
          run.src_offset + run.rows * run.src_stride == copy.src_offset &&
          run.dst_offset + run.rows * run.dst_stride == copy.dst_offset &&
          (run.rows + copy.rows) * run.length <= kMostMergedBytes) {
        run.rows += copy.rows;
        return true;
      }
      if (run.length != 0) {
        if (n == capacity) return false;
        out[n++] = run;
      }
      run = copy;
      return true;
    } else {
      if (n == capacity) return false;
      out[n++] = copy;
      return true;
    }
  };
  while (fragment_ < fragments.size()) {
    if (fragment_mask_ != nullptr && !(*fragment_mask_)[fragment_]) {
      ++fragment_;
      EnterFragment();
      continue;
    }
    const BoundFragment& b = fragments[fragment_];
    const int64_t* s = src_->groups[b.group_index].block_ids.data();
    const int64_t* t = dst_->groups[b.group_index].block_ids.data();
    const size_t blocks = src_->groups[b.group_index].block_ids.size();
    const int64_t src_base = b.src_base, src_stride = b.src_page_stride;
    const int64_t dst_base = b.dst_base, dst_stride = b.dst_page_stride;
    const uint64_t length = static_cast<uint64_t>(b.bytes_per_row);
    const bool filtered = b.owner.owner_count > 1;
    bool full = false;
    if (b.rows == 1 && !filtered) {
      // Whole-page fragments (the common case after §6.3's row merge).
      for (; position_ < blocks; ++position_) {
        if (!emit(Copy{static_cast<uint64_t>(src_base + s[position_] * src_stride),
                       static_cast<uint64_t>(dst_base + t[position_] * dst_stride), length})) {
          full = true;
          break;
        }
      }
    } else {
      for (; position_ < blocks && !full; ++position_, row_ = 0) {
        // A page-sharded group (§12.8): only the owned virtual ids, each from its local page.
        if (filtered && !b.owner.Owns(s[position_])) continue;
        const int64_t page = filtered ? b.owner.LocalPage(s[position_]) : s[position_];
        const uint64_t src_page = static_cast<uint64_t>(src_base + page * src_stride);
        const uint64_t dst_page = static_cast<uint64_t>(dst_base + t[position_] * dst_stride);
        if (strided_ && row_ == 0) {
          // The page's rows as one copy: strided, or plain where they are contiguous on both
          // sides.
          const bool contiguous = b.rows == 1 || (b.src_row_stride == b.bytes_per_row &&
                                                  b.dst_row_stride == b.bytes_per_row);
          const Copy page_rows =
              contiguous ? Copy{src_page, dst_page, length * static_cast<uint64_t>(b.rows)}
                         : Copy{src_page,
                                dst_page,
                                length,
                                static_cast<uint64_t>(b.rows),
                                static_cast<uint64_t>(b.src_row_stride),
                                static_cast<uint64_t>(b.dst_row_stride)};
          if (!emit(page_rows)) {
            full = true;
            break;
          }
          continue;
        }
        for (; row_ < b.rows; ++row_) {
          if (!emit(Copy{src_page + static_cast<uint64_t>(row_ * b.src_row_stride),
                         dst_page + static_cast<uint64_t>(row_ * b.dst_row_stride), length})) {
            full = true;
            break;
          }
        }
        if (full) break;  // resume at this position and row
      }
    }
    if (full) break;
    ++fragment_;
    EnterFragment();
  }
  if (fragment_ >= fragments.size() && run.length != 0 && n < capacity) {
    out[n++] = run;
    run.length = 0;
  }
  run_ = run;
  return n;
}

bool CopyCursor::done() const { return fragment_ >= plan_->fragments_.size() && run_.length == 0; }

namespace {

// Merges runs in copies[0, n) in place; returns the new count.
size_t CoalesceRange(Copy* copies, size_t n) {
  if (n == 0) return 0;
  size_t last = 0;
  for (size_t i = 1; i < n; ++i) {
    Copy& run = copies[last];
    const Copy& next = copies[i];
    if (run.rows == 1 && next.rows == 1 && run.src_offset + run.length == next.src_offset &&
        run.dst_offset + run.length == next.dst_offset &&
        run.length + next.length <= kMostMergedBytes) {
      run.length += next.length;
    } else {
      copies[++last] = next;
    }
  }
  return last + 1;
}

}  // namespace

size_t Coalesce(std::vector<Copy>& copies) {
  copies.resize(CoalesceRange(copies.data(), copies.size()));
  return copies.size();
}

size_t Coalesce(CopyList& copies) {
  copies.Truncate(CoalesceRange(copies.begin(), copies.size()));
  return copies.size();
}

}  // namespace kvrail::plan
