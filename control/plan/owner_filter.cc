#include "control/plan/owner_filter.h"

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::plan {

bool operator==(const OwnerFilter& a, const OwnerFilter& b) {
  return a.owners == b.owners && a.owner == b.owner;
}

bool operator==(const GroupOwnerFilter& a, const GroupOwnerFilter& b) {
  return a.group_id == b.group_id && a.filter == b.filter;
}

const OwnerFilter* FindOwnerFilter(absl::Span<const GroupOwnerFilter> filters,
                                   absl::string_view group_id) {
  for (const GroupOwnerFilter& f : filters) {
    if (f.group_id == group_id) return &f.filter;
  }
  return nullptr;
}

absl::Status ValidateShardedGroups(absl::Span<const ShardedGroup> sharded,
                                   const layout::Contract& prefill, int prefill_tp) {
  std::set<std::string> seen;
  for (const ShardedGroup& g : sharded) {
    auto fail = [&g](absl::string_view rule) {
      return MakeError(ErrorCategory::kUnsupportedLayout,
                       absl::StrCat("sharded group '", g.group_id, "' with ", g.owners,
                                    " owners: ", rule, " (CACHEPD §10.3)"));
    };
    if (prefill.FindGroupSpec(g.group_id) == nullptr) {
      return fail("the prefill contract has no such group spec");
    }
    if (!seen.insert(g.group_id).second) return fail("the group is declared twice");
    if (g.owners < 2 || g.owners > prefill_tp || prefill_tp % g.owners != 0) {
      return fail(absl::StrCat("owners must be in 2..", prefill_tp, " and divide the prefill TP ",
                               prefill_tp));
    }
  }
  return absl::OkStatus();
}

int OwnersOf(absl::Span<const ShardedGroup> sharded, absl::string_view group_id) {
  for (const ShardedGroup& g : sharded) {
    if (g.group_id == group_id) return g.owners;
  }
  return 1;
}

absl::Status ValidateOwnerCoverage(absl::Span<const RangeSender> senders,
                                   absl::Span<const ShardedGroup> sharded) {
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
                       first.dst_byte_offset, "): ", rule, " (CACHEPD §10.3)"));
    };
    const int owners = OwnersOf(sharded, first.group_id);
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
      if (s->filter->owners != owners) {
        return fail(absl::StrCat("filter has ", s->filter->owners, " owners, the group ", owners));
      }
      if (s->filter->owner != s->prefill_rank % owners) {
        return fail(absl::StrCat("prefill rank ", s->prefill_rank, " claims owner ",
                                 s->filter->owner, " but holds owner ", s->prefill_rank % owners));
      }
      ++count[s->filter->owner];
    }
    for (int o = 0; o < owners; ++o) {
      if (count[o] != 1) {
        return fail(absl::StrCat("owner ", o, " has ", count[o], " senders, needs exactly 1"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail::plan
