#include "control/plan/route.h"

namespace kvrail::plan {

const SourceFragments* Route::Find(int prefill_rank) const {
  for (const SourceFragments& source : sources) {
    if (source.prefill_rank == prefill_rank) {
      return &source;
    }
  }
  return nullptr;
}

std::vector<int> Route::PrefillRanks() const {
  std::vector<int> ranks;
  ranks.reserve(sources.size());
  for (const SourceFragments& source : sources) {
    ranks.push_back(source.prefill_rank);
  }
  return ranks;
}

bool operator==(const DecodeTargets& a, const DecodeTargets& b) {
  return a.expected_prefill_ranks == b.expected_prefill_ranks &&
         a.dummy_tp_ranks == b.dummy_tp_ranks && a.target_tp_ranks == b.target_tp_ranks;
}

absl::string_view OutcomeName(RegistrationOutcome::Kind kind) {
  switch (kind) {
    case RegistrationOutcome::Kind::kSend:
      return "send";
    case RegistrationOutcome::Kind::kDummy:
      return "dummy";
    case RegistrationOutcome::Kind::kReject:
      return "reject";
  }
  return "reject";
}

std::vector<RangeSender> RangeSendersOf(const Route& route) {
  std::vector<RangeSender> senders;
  for (const SourceFragments& source : route.sources) {
    for (const Fragment& f : source.fragments) {
      senders.push_back({source.prefill_rank, f.group_id, f.field_id, f.dst_byte_offset,
                         f.dst_row_stride_bytes, f.bytes_per_row, f.rows_per_page,
                         FindOwnerFilter(source.owner_filters, f.group_id)});
    }
  }
  return senders;
}

}  // namespace kvrail::plan
