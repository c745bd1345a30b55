#include "control/plan/copy_plan.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "control/error/error.h"

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
  b.src_page_count = src.FindGroup(sf->group_id)->page_count;
  b.dst_page_count = dst.FindGroup(df->group_id)->page_count;
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

bool operator==(const Copy& a, const Copy& b) {
  return a.src_offset == b.src_offset && a.dst_offset == b.dst_offset && a.length == b.length;
}

absl::StatusOr<CopyPlan> CopyPlan::Bind(const layout::Contract& src, const layout::Contract& dst,
                                        absl::Span<const Fragment> fragments,
                                        absl::Span<const GroupOwnerFilter> owner_filters) {
  CopyPlan plan;
  plan.group_specs_ = src.group_specs;
  for (const GroupOwnerFilter& f : owner_filters) {
    if (src.FindGroupSpec(f.group_id) == nullptr || f.filter.owners < 1 || f.filter.owner < 0 ||
        f.filter.owner >= f.filter.owners) {
      return BindError(absl::StrCat("owner filter {", f.filter.owners, ", ", f.filter.owner,
                                    "} of group '", f.group_id, "' is invalid (CACHEPD §10.3)"));
    }
  }
  plan.group_count_ = src.group_specs.size();
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
      }
    } else {
      for (const Fragment& fragment : fragments) {
        if (fragment.group_id != group_id) {
          continue;
        }
        KVRAIL_ASSIGN_OR_RETURN(
            BoundFragment b, BindOne(src, dst, static_cast<int>(g), fragment.field_id, &fragment));
        plan.fragments_.push_back(b);
      }
    }
    if (owner != nullptr) {
      for (size_t i = first; i < plan.fragments_.size(); ++i) {
        plan.fragments_[i].owner = *owner;
      }
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
  if (fragment.owner.owners <= 1) return true;
  const layout::SlotRange slots =
      layout::LogicalSlots(group_specs_[fragment.group_index], room.prefix_len, room.prompt_len);
  return fragment.owner.Owns(slots.begin + static_cast<int64_t>(position));
}

int64_t CopyPlan::CountCopies(const layout::Manifest& src) const {
  int64_t count = 0;
  for (const BoundFragment& b : fragments_) {
    if (b.group_index >= static_cast<int>(src.groups.size())) continue;
    const size_t blocks = src.groups[b.group_index].block_ids.size();
    if (b.owner.owners <= 1) {
      count += b.rows * static_cast<int64_t>(blocks);
      continue;
    }
    for (size_t i = 0; i < blocks; ++i) count += SendsPosition(b, src, i) ? b.rows : 0;
  }
  return count;
}

absl::Status CopyPlan::Expand(const layout::Manifest& src, const layout::Manifest& dst,
                              std::vector<Copy>& out) const {
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
  for (const BoundFragment& b : fragments_) {
    const auto& s = src.groups[b.group_index].block_ids;
    const auto& t = dst.groups[b.group_index].block_ids;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] <= 0 || s[i] >= b.src_page_count || t[i] <= 0 || t[i] >= b.dst_page_count) {
        return RoomError(absl::StrCat("group '", src.groups[b.group_index].group_id, "' position ",
                                      i, " pairs block ", s[i], " with block ", t[i],
                                      "; pages are 1..", b.src_page_count - 1, " and 1..",
                                      b.dst_page_count - 1));
      }
    }
  }
  out.reserve(out.size() + static_cast<size_t>(CountCopies(src)));
  for (const BoundFragment& b : fragments_) {
    const auto& s = src.groups[b.group_index].block_ids;
    const auto& t = dst.groups[b.group_index].block_ids;
    for (size_t i = 0; i < s.size(); ++i) {
      if (!SendsPosition(b, src, i)) continue;
      uint64_t src_page = static_cast<uint64_t>(b.src_base + s[i] * b.src_page_stride);
      uint64_t dst_page = static_cast<uint64_t>(b.dst_base + t[i] * b.dst_page_stride);
      for (int64_t row = 0; row < b.rows; ++row) {
        out.push_back({src_page + static_cast<uint64_t>(row * b.src_row_stride),
                       dst_page + static_cast<uint64_t>(row * b.dst_row_stride),
                       static_cast<uint64_t>(b.bytes_per_row)});
      }
    }
  }
  return absl::OkStatus();
}

size_t Coalesce(std::vector<Copy>& copies) {
  if (copies.empty()) {
    return 0;
  }
  size_t last = 0;
  for (size_t i = 1; i < copies.size(); ++i) {
    Copy& run = copies[last];
    const Copy& next = copies[i];
    if (run.src_offset + run.length == next.src_offset &&
        run.dst_offset + run.length == next.dst_offset) {
      run.length += next.length;
    } else {
      copies[++last] = next;
    }
  }
  copies.resize(last + 1);
  return copies.size();
}

}  // namespace kvrail::plan
