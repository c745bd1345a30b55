#include "control/plan/planner.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/layout/dtype.h"
#include "engine/base/error.h"

namespace kvrail::plan {
namespace {

absl::Status LayoutError(absl::string_view message) {
  return MakeError(ErrorCategory::kUnsupportedLayout, message);
}

absl::Status CheckTpSize(absl::string_view side, int tp) {
  if (tp >= 1 && tp <= kMaxTpSize) {
    return absl::OkStatus();
  }
  return LayoutError(
      absl::StrCat(side, " TP size ", tp, " is outside 1..", kMaxTpSize, " (CACHEPD §6.1)"));
}

int64_t Product(const std::vector<int64_t>& extents, size_t begin, size_t end) {
  int64_t product = 1;
  for (size_t i = begin; i < end; ++i) {
    product *= extents[i];
  }
  return product;
}

// §6.3 row merge: rows that are contiguous on both sides become one row.
void MergeRows(Fragment& f) {
  if (f.rows_per_page > 1 && f.src_row_stride_bytes == f.bytes_per_row &&
      f.dst_row_stride_bytes == f.bytes_per_row) {
    f.bytes_per_row *= f.rows_per_page;
    f.src_row_stride_bytes = f.bytes_per_row;
    f.dst_row_stride_bytes = f.bytes_per_row;
    f.rows_per_page = 1;
  }
}

bool Contains(const std::vector<int>& sorted, int value) {
  return std::binary_search(sorted.begin(), sorted.end(), value);
}

}  // namespace

absl::StatusOr<Planner> Planner::Create(int prefill_tp, int decode_tp,
                                        const layout::Contract& prefill,
                                        const layout::Contract& decode, const StageFilter* stage) {
  KVRAIL_RETURN_IF_ERROR(CheckTpSize("prefill", prefill_tp));
  KVRAIL_RETURN_IF_ERROR(CheckTpSize("decode", decode_tp));

  // The fields a pipeline stage holds; nullopt when the planner routes every field (§12.6).
  std::optional<absl::flat_hash_set<std::string>> held;
  if (stage != nullptr) {
    held.emplace();
    for (const std::string& field_id : stage->field_ids) {
      if (prefill.FindField(field_id) == nullptr) {
        return LayoutError(absl::StrCat("stage placement contains unknown cache fields: '",
                                        field_id,
                                        "' is no field of the prefill contract (CACHEPD §12.6)"));
      }
      held->insert(field_id);
    }
    // Field ids are unique in a contract, so holding as many as it declares is holding all.
    if (held->size() == prefill.plan.fields.size()) {
      held.reset();
    }
  }

  KVRAIL_RETURN_IF_ERROR(layout::CheckPeerContracts(prefill, decode));

  Planner planner;
  planner.prefill_tp_ = prefill_tp;
  planner.decode_tp_ = decode_tp;

  // Page-sharded groups (§12.8): declared by the prefill's shard_count; the decode must hold
  // every block, and each owner subgroup must fit the prefill TP ranks.
  for (const layout::GroupSpec& spec : decode.group_specs) {
    if (spec.shard_count != 1) {
      return LayoutError(absl::StrCat("cache group '", spec.group_id,
                                      "' is sharded on Decode; PD transfer into a DCP-sharded "
                                      "destination is not supported (CACHEPD §12.8)"));
    }
  }
  for (const layout::GroupSpec& spec : prefill.group_specs) {
    if (spec.shard_count == 1) continue;
    if (spec.shard_count < 1 || prefill_tp % spec.shard_count != 0) {
      return LayoutError(absl::StrCat("cache group '", spec.group_id, "' shard count ",
                                      spec.shard_count, " does not divide Prefill TP=", prefill_tp,
                                      " (CACHEPD §12.8)"));
    }
    for (const layout::FieldLayout* field : prefill.FieldsOfGroup(spec.group_id)) {
      if (prefill.FindPartition(field->field_id) != nullptr) {
        return LayoutError(absl::StrCat("cache group '", spec.group_id, "' is sharded over ",
                                        spec.shard_count, " owners but its field '",
                                        field->field_id,
                                        "' has a head partition; a sharded group's fields must "
                                        "be replicated in TP (CACHEPD §12.8)"));
      }
    }
    planner.sharded_group_ids_.push_back(spec.group_id);
  }
  planner.whole_field_copy_ =
      prefill_tp == decode_tp && !held.has_value() && planner.sharded_group_ids_.empty();

  for (const layout::GroupSpec& spec : prefill.group_specs) {
    std::vector<const layout::FieldLayout*> prefill_fields = prefill.FieldsOfGroup(spec.group_id);
    std::vector<const layout::FieldLayout*> decode_fields = decode.FieldsOfGroup(spec.group_id);
    if (prefill_fields.size() != decode_fields.size()) {
      // CheckPeerContracts has already refused this; kept so no index below can overrun.
      return MakeError(ErrorCategory::kIncompatiblePeer,
                       absl::StrCat("group '", spec.group_id,
                                    "' has different fields on the two sides (CACHEPD §4.5)"));
    }
    for (size_t i = 0; i < prefill_fields.size(); ++i) {
      const layout::FieldLayout& pf = *prefill_fields[i];
      const layout::FieldLayout& df = *decode_fields[i];
      if (held.has_value() && !held->contains(pf.field_id)) {
        continue;
      }

      Segment segment;
      // Checked above: 1, or a divisor of prefill_tp <= kMaxTpSize.
      segment.owners = static_cast<int>(spec.shard_count);
      segment.group_id = spec.group_id;
      segment.field_id = pf.field_id;
      segment.prefill_payload_bytes = layout::PayloadBytes(pf);
      segment.decode_payload_bytes = layout::PayloadBytes(df);
      if (prefill_tp == decode_tp &&
          (pf.shape != df.shape || segment.prefill_payload_bytes != segment.decode_payload_bytes)) {
        return LayoutError(absl::StrCat(
            "equal-TP field '", pf.field_id, "' rank-local geometry differs: prefill shape [",
            absl::StrJoin(pf.shape, ","), "] (", segment.prefill_payload_bytes,
            " bytes) vs decode shape [", absl::StrJoin(df.shape, ","), "] (",
            segment.decode_payload_bytes, " bytes) at TP=", prefill_tp, " (CACHEPD §6.1, §6.6)"));
      }

      const layout::Partition* partition = prefill.FindPartition(pf.field_id);
      if (partition != nullptr) {
        const size_t rank = pf.shape.size();
        if (partition->axis < 0 || static_cast<size_t>(partition->axis) >= rank ||
            df.shape.size() != rank) {
          return LayoutError(absl::StrCat("field '", pf.field_id, "' partition axis ",
                                          partition->axis, " is outside its shape (CACHEPD §4.4)"));
        }
        const size_t axis = static_cast<size_t>(partition->axis);
        absl::StatusOr<ShardMap> prefill_shards =
            ShardMap::Create(pf.field_id, *partition, pf.shape[axis], prefill_tp);
        if (!prefill_shards.ok()) {
          return AddContext(prefill_shards.status(), "prefill side");
        }
        absl::StatusOr<ShardMap> decode_shards =
            ShardMap::Create(df.field_id, *partition, df.shape[axis], decode_tp);
        if (!decode_shards.ok()) {
          return AddContext(decode_shards.status(), "decode side");
        }
        segment.prefill_shards = *std::move(prefill_shards);
        segment.decode_shards = *std::move(decode_shards);
        // Both sides share the inner dimensions (§4.5: equal global shapes), so the element
        // step along the axis comes from the prefill shape, as the reference does.
        segment.inner_bytes = Product(pf.shape, axis + 1, rank) * layout::DTypeSize(pf.dtype);
        segment.rows = Product(pf.shape, 0, axis);
        segment.src_row_stride = pf.shape[axis] * segment.inner_bytes;
        segment.dst_row_stride = df.shape[axis] * segment.inner_bytes;
      }
      planner.segments_.push_back(std::move(segment));
    }
  }

  planner.served_by_prefill_rank_.assign(prefill_tp, {});
  planner.sources_of_decode_rank_.assign(decode_tp, {});
  if (planner.whole_field_copy_) {
    for (int p = 0; p < prefill_tp; ++p) {
      planner.served_by_prefill_rank_[p] = {p};
    }
    for (int d = 0; d < decode_tp; ++d) {
      planner.sources_of_decode_rank_[d] = {d};
    }
    return planner;
  }
  for (int d = 0; d < decode_tp; ++d) {
    std::vector<int>& sources = planner.sources_of_decode_rank_[d];
    planner.ForEachFragment(d, [&sources](int p, const Segment&, const Fragment&) {
      if (sources.empty() || sources.back() != p) {
        sources.push_back(p);
      }
    });
    std::sort(sources.begin(), sources.end());
    sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
    for (int p : sources) {
      planner.served_by_prefill_rank_[p].push_back(d);
    }
  }
  return planner;
}

template <typename Visit>
void Planner::ForEachFragment(int d, Visit&& visit) const {
  for (const Segment& segment : segments_) {
    if (!segment.prefill_shards.has_value()) {
      // A replicated field comes whole from prefill rank floor(d * P / D) (§6.3).
      Fragment f;
      f.rows_per_page = 1;
      f.bytes_per_row = segment.prefill_payload_bytes;
      f.src_row_stride_bytes = segment.prefill_payload_bytes;
      f.dst_row_stride_bytes = segment.decode_payload_bytes;
      MergeRows(f);
      const int base = static_cast<int>(static_cast<int64_t>(d) * prefill_tp_ / decode_tp_);
      // A sharded group takes the whole owner subgroup around the reference's source (§12.8).
      const int first = base - base % segment.owners;
      for (int p = first; p < first + segment.owners; ++p) visit(p, segment, f);
      continue;
    }
    const ShardMap& src = *segment.prefill_shards;
    const ShardMap& dst = *segment.decode_shards;
    // Decode shard t covers the same fraction [t / k_d, (t + 1) / k_d) of every part, and
    // prefill shard s covers [s / k_p, (s + 1) / k_p): they meet exactly when
    // floor(t * k_p / k_d) <= s < ceil((t + 1) * k_p / k_d). Visiting only those shards, in
    // ascending order, gives the reference's walk over every representative prefill rank.
    const int64_t t = dst.ShardOf(d);
    const int64_t kp = src.distinct_shards();
    const int64_t kd = dst.distinct_shards();
    const int64_t first = t * kp / kd;
    const int64_t last = std::min(kp, ((t + 1) * kp + kd - 1) / kd);
    for (int64_t s = first; s < last; ++s) {
      const int p = src.RepresentativeOf(s);
      for (size_t part = 0; part < src.part_count(); ++part) {
        const RankInterval pi = src.ShardInterval(s, part);
        const RankInterval di = dst.ShardInterval(t, part);
        const int64_t a = std::max(pi.global_begin, di.global_begin);
        const int64_t b = std::min(pi.global_end, di.global_end);
        if (a >= b) {
          continue;
        }
        Fragment f;
        f.rows_per_page = segment.rows;
        f.src_row_stride_bytes = segment.src_row_stride;
        f.dst_row_stride_bytes = segment.dst_row_stride;
        f.bytes_per_row = (b - a) * segment.inner_bytes;
        f.src_byte_offset = (pi.local_offset + a - pi.global_begin) * segment.inner_bytes;
        f.dst_byte_offset = (di.local_offset + a - di.global_begin) * segment.inner_bytes;
        MergeRows(f);
        visit(p, segment, f);  // partitioned fields are never sharded (Create)
      }
    }
  }
}

absl::Status Planner::CheckDecodeRank(int d) const {
  if (d < 0 || d >= decode_tp_) {
    return LayoutError(
        absl::StrCat("decode TP rank ", d, " is outside 0..", decode_tp_ - 1, " (CACHEPD §6.1)"));
  }
  if (sources_of_decode_rank_[d].empty()) {
    return LayoutError(absl::StrCat("decode TP rank ", d,
                                    " has no source fragments: no cache field is routed "
                                    "(CACHEPD §6.1)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Route> Planner::PlanForDecodeRank(int d) const {
  KVRAIL_RETURN_IF_ERROR(CheckDecodeRank(d));
  Route route;
  if (whole_field_copy_) {
    route.whole_field_copy = true;
    route.sources.push_back(SourceFragments{d, {}});
    return route;
  }
  const std::vector<int>& ranks = sources_of_decode_rank_[d];
  route.sources.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    route.sources[i].prefill_rank = ranks[i];
  }
  ForEachFragment(d, [&](int p, const Segment& segment, Fragment f) {
    const size_t index = std::lower_bound(ranks.begin(), ranks.end(), p) - ranks.begin();
    f.group_id = segment.group_id;
    f.field_id = segment.field_id;
    route.sources[index].fragments.push_back(std::move(f));
  });
  for (SourceFragments& source : route.sources) {
    source.owner_filters = OwnerFiltersFor(source.prefill_rank, d);
  }
  return route;
}

const std::vector<int>& Planner::DecodeRanksServedBy(int p) const {
  static const std::vector<int>* const kNone = new std::vector<int>();
  if (p < 0 || p >= prefill_tp_) {
    return *kNone;
  }
  return served_by_prefill_rank_[p];
}

absl::StatusOr<DecodeTargets> Planner::TargetsFor(int d) const {
  KVRAIL_RETURN_IF_ERROR(CheckDecodeRank(d));
  DecodeTargets targets;
  targets.expected_prefill_ranks = sources_of_decode_rank_[d];
  if (d == 0) {
    for (int p = 0; p < prefill_tp_; ++p) {
      if (served_by_prefill_rank_[p].empty()) {
        targets.dummy_tp_ranks.push_back(p);
      }
    }
  }
  std::set_union(targets.expected_prefill_ranks.begin(), targets.expected_prefill_ranks.end(),
                 targets.dummy_tp_ranks.begin(), targets.dummy_tp_ranks.end(),
                 std::back_inserter(targets.target_tp_ranks));
  return targets;
}

RegistrationOutcome Planner::OnRegistration(int p, int d) const {
  RegistrationOutcome outcome;
  if (p < 0 || p >= prefill_tp_) {
    outcome.error = LayoutError(absl::StrCat("prefill TP rank ", p, " is outside 0..",
                                             prefill_tp_ - 1, " (CACHEPD §3.2.2)"));
    return outcome;
  }
  outcome.error = CheckDecodeRank(d);
  if (!outcome.error.ok()) {
    return outcome;
  }
  const std::vector<int>& served = served_by_prefill_rank_[p];
  if (Contains(sources_of_decode_rank_[d], p)) {
    outcome.kind = RegistrationOutcome::Kind::kSend;
    outcome.expected_decode_ranks = served;
    if (!whole_field_copy_) {
      ForEachFragment(d, [&](int source, const Segment& segment, Fragment f) {
        if (source != p) {
          return;
        }
        f.group_id = segment.group_id;
        f.field_id = segment.field_id;
        outcome.fragments.push_back(std::move(f));
      });
      outcome.owner_filters = OwnerFiltersFor(p, d);
    }
    return outcome;
  }
  if (d == 0 && served.empty()) {
    outcome.kind = RegistrationOutcome::Kind::kDummy;
    outcome.expected_decode_ranks = {0};
    outcome.owner_filters = NoOwnerFilters();
    return outcome;
  }
  outcome.error = LayoutError(
      absl::StrCat("registration of decode TP rank ", d, " targets the wrong prefill TP rank ", p,
                   ": it is neither a source of that rank's route nor a dummy for decode "
                   "rank 0 (CACHEPD §3.2.2)"));
  return outcome;
}

std::vector<GroupOwnerFilter> Planner::OwnerFiltersFor(int p, int d) const {
  std::vector<GroupOwnerFilter> decisions = NoOwnerFilters();
  if (decisions.empty()) return decisions;
  ForEachFragment(d, [&](int source, const Segment& segment, const Fragment&) {
    if (source != p || segment.owners == 1) return;
    for (GroupOwnerFilter& decision : decisions) {
      if (decision.group_id == segment.group_id) {
        decision.filter = OwnerFilter{p % segment.owners, segment.owners};
      }
    }
  });
  return decisions;
}

std::vector<GroupOwnerFilter> Planner::NoOwnerFilters() const {
  std::vector<GroupOwnerFilter> decisions;
  decisions.reserve(sharded_group_ids_.size());
  for (const std::string& group_id : sharded_group_ids_) {
    decisions.push_back({group_id, std::nullopt});
  }
  return decisions;
}

int Planner::RequiredPreallocations(int p) const {
  if (p < 0 || p >= prefill_tp_) {
    return 0;
  }
  const size_t served = served_by_prefill_rank_[p].size();
  return served == 0 ? 1 : static_cast<int>(served);
}

int Planner::RequiredCompletions(int d) const {
  if (d < 0 || d >= decode_tp_) {
    return 0;
  }
  return static_cast<int>(sources_of_decode_rank_[d].size());
}

}  // namespace kvrail::plan
