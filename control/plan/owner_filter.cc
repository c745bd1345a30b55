#include "control/plan/owner_filter.h"

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

absl::Status LayoutError(absl::string_view message, absl::string_view section) {
  return MakeError(ErrorCategory::kUnsupportedLayout,
                   absl::StrCat(message, " (CACHEPD ", section, ")"));
}

bool NamesGroup(absl::Span<const Fragment> fragments, absl::string_view group_id) {
  if (fragments.empty()) return true;  // the whole-field copy sends every group
  for (const Fragment& f : fragments) {
    if (f.group_id == group_id) return true;
  }
  return false;
}

const GroupOwnerFilter* FindDecision(absl::Span<const GroupOwnerFilter> decisions,
                                     absl::string_view group_id) {
  for (const GroupOwnerFilter& d : decisions) {
    if (d.group_id == group_id) return &d;
  }
  return nullptr;
}

}  // namespace

bool operator==(const OwnerFilter& a, const OwnerFilter& b) {
  return a.owner_rank == b.owner_rank && a.owner_count == b.owner_count;
}

bool operator==(const GroupOwnerFilter& a, const GroupOwnerFilter& b) {
  return a.group_id == b.group_id && a.filter == b.filter;
}

absl::Status CheckOwnerFilter(const OwnerFilter& filter) {
  if (filter.owner_count >= 2 && filter.owner_rank >= 0 && filter.owner_rank < filter.owner_count) {
    return absl::OkStatus();
  }
  return LayoutError(absl::StrCat("cache page owner filter needs 0 <= rank < count >= 2, got "
                                  "owner_rank ",
                                  filter.owner_rank, " of owner_count ", filter.owner_count),
                     "§12.8");
}

const OwnerFilter* FindOwnerFilter(absl::Span<const GroupOwnerFilter> decisions,
                                   absl::string_view group_id) {
  const GroupOwnerFilter* decision = FindDecision(decisions, group_id);
  if (decision == nullptr || !decision->filter.has_value()) return nullptr;
  return &*decision->filter;
}

absl::Status ValidateOwnerDecisions(absl::Span<const Fragment> fragments,
                                    absl::Span<const GroupOwnerFilter> decisions,
                                    absl::Span<const layout::GroupSpec> group_specs) {
  auto spec_of = [&group_specs](absl::string_view group_id) -> const layout::GroupSpec* {
    for (const layout::GroupSpec& spec : group_specs) {
      if (spec.group_id == group_id) return &spec;
    }
    return nullptr;
  };
  std::set<std::string> seen;
  for (const GroupOwnerFilter& decision : decisions) {
    const layout::GroupSpec* spec = spec_of(decision.group_id);
    if (spec == nullptr || spec->shard_count <= 1) {
      return LayoutError(absl::StrCat("owner filter names cache group '", decision.group_id,
                                      "', which is not sharded"),
                         "§12.7");
    }
    if (!seen.insert(decision.group_id).second) {
      return LayoutError(
          absl::StrCat("cache group '", decision.group_id, "' has two owner-filter decisions"),
          "§12.7");
    }
    if (decision.filter.has_value()) {
      KVRAIL_RETURN_IF_ERROR(AddContext(CheckOwnerFilter(*decision.filter),
                                        absl::StrCat("cache group '", decision.group_id, "'")));
    }
  }
  for (const layout::GroupSpec& spec : group_specs) {
    if (spec.shard_count <= 1) continue;
    const GroupOwnerFilter* decision = FindDecision(decisions, spec.group_id);
    if (decision == nullptr) {
      return LayoutError(absl::StrCat("cache group '", spec.group_id,
                                      "' is sharded but the registration route carries no "
                                      "owner-filter decision for it"),
                         "§12.7");
    }
    const bool named = NamesGroup(fragments, spec.group_id);
    if (!decision->filter.has_value()) {
      if (named) {
        return LayoutError(absl::StrCat("cache group '", spec.group_id,
                                        "' has fragments in the registration route but its "
                                        "owner-filter decision is none"),
                           "§12.7");
      }
      continue;
    }
    if (decision->filter->owner_count != spec.shard_count) {
      return LayoutError(absl::StrCat("cache group '", spec.group_id, "' owner filter (",
                                      decision->filter->owner_count,
                                      " owners) disagrees with its shard count ", spec.shard_count),
                         "§12.7");
    }
    if (!named) {
      return LayoutError(absl::StrCat("cache group '", spec.group_id,
                                      "' has an owner filter but the registration route "
                                      "carries no fragment of it"),
                         "§12.7");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<OwnedBlocks> SelectOwnedBlocks(const OwnerFilter& filter,
                                              absl::Span<const int64_t> source_block_ids,
                                              absl::Span<const int64_t> destination_block_ids,
                                              int64_t virtual_block_count) {
  if (source_block_ids.size() != destination_block_ids.size()) {
    return MakeError(
        ErrorCategory::kInvalidManifest,
        absl::StrCat("sharded group pairs ", source_block_ids.size(), " source blocks with ",
                     destination_block_ids.size(), " destination blocks (CACHEPD §6.9)"));
  }
  OwnedBlocks out;
  for (size_t i = 0; i < source_block_ids.size(); ++i) {
    const int64_t v = source_block_ids[i];
    if (v < 0 || v >= virtual_block_count) {
      return MakeError(
          ErrorCategory::kInvalidManifest,
          absl::StrCat("virtual cache block ID is out of range: ", v, " at position ", i,
                       " is outside 0..", virtual_block_count - 1, " (CACHEPD §12.8)"));
    }
    if (!filter.Owns(v)) continue;
    out.positions.push_back(static_cast<int64_t>(i));
    out.source_local_pages.push_back(filter.LocalPage(v));
    out.destination_block_ids.push_back(destination_block_ids[i]);
  }
  return out;
}

absl::Status ValidateOwnerCoverage(absl::Span<const RangeSender> senders,
                                   const layout::Contract& prefill) {
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<const RangeSender*>> by_range;
  for (const RangeSender& s : senders) {
    by_range[Key{s.field_id, s.dst_byte_offset, s.dst_row_stride, s.bytes_per_row, s.rows}]
        .push_back(&s);
  }
  for (const auto& [key, list] : by_range) {
    const RangeSender& first = *list.front();
    auto fail = [&first](absl::string_view rule) {
      return MakeError(
          ErrorCategory::kUnsupportedLayout,
          absl::StrCat("owner filters of field '", first.field_id, "' (destination offset ",
                       first.dst_byte_offset, "): ", rule, " (CACHEPD §12.8)"));
    };
    const layout::GroupSpec* spec = prefill.FindGroupSpec(first.group_id);
    const int64_t owners = spec == nullptr ? 1 : spec->shard_count;
    if (owners == 1) {
      if (list.size() != 1 || first.filter != nullptr) {
        return fail(absl::StrCat("an unsharded group needs exactly one unfiltered sender, got ",
                                 list.size()));
      }
      continue;
    }
    std::vector<int> count(owners, 0);
    for (const RangeSender* s : list) {
      if (s->filter == nullptr) return fail("a sender of a sharded group has no filter");
      if (s->filter->owner_count != owners) {
        return fail(
            absl::StrCat("filter has ", s->filter->owner_count, " owners, the group ", owners));
      }
      if (s->filter->owner_rank != s->prefill_rank % owners) {
        return fail(absl::StrCat("prefill rank ", s->prefill_rank, " claims owner ",
                                 s->filter->owner_rank, " but is owner ",
                                 s->prefill_rank % owners));
      }
      ++count[s->filter->owner_rank];
    }
    for (int64_t o = 0; o < owners; ++o) {
      if (count[o] != 1) {
        return fail(absl::StrCat("owner ", o, " has ", count[o], " senders, needs exactly 1"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail::plan
