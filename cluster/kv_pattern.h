// The engine simulator's KV content: every byte of a room's cache is a function of global
// coordinates only (room, group, field, manifest position, row, global index on the partition
// axis, byte), so a prefill rank can fill its slice and a decode rank of any TP size can check
// its own slice, and all of them agree on what the whole cache holds.
//
// A page of field f with rank-local shape [s0, ..., s(a), ..., sn] and partition axis a is
// split into runs: for each outer index (over axes before a) and each local index l on axis a,
// a run of prod(s(a+1..n)) * element bytes, generated from a seed of the run's global
// coordinates. Replicated fields are one run per outer index with global index 0.
#ifndef KVRAIL_CLUSTER_KV_PATTERN_H_
#define KVRAIL_CLUSTER_KV_PATTERN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"

namespace kvrail::sim {

// One rank's view of its arena: its contract and its place in its side's attention TP.
class RankLayout {
 public:
  static absl::StatusOr<RankLayout> Create(layout::Contract contract, int tp_size, int tp_rank);

  const layout::Contract& contract() const { return contract_; }

  // Writes the room's pattern into every page `manifest` names. `arena` is the whole arena.
  absl::Status Fill(const layout::Manifest& manifest, uint64_t room,
                    absl::Span<uint8_t> arena) const;
  // OK when every page `manifest` names holds the room's pattern; otherwise DataLoss naming
  // the first wrong byte (field, position, block, offset).
  absl::Status Check(const layout::Manifest& manifest, uint64_t room,
                     absl::Span<const uint8_t> arena) const;
  // Check on a sample: manifest positions first, first + every, first + 2 * every, ... of
  // every field (every >= 1; every = 1 and first = 0 is Check). For a benchmark that checks
  // each room without paying for every byte of each.
  absl::Status CheckSample(const layout::Manifest& manifest, uint64_t room,
                           absl::Span<const uint8_t> arena, int64_t every, int64_t first) const;
  // The bytes of this rank's slice of the pages `manifest` names: what Check compares.
  int64_t Bytes(const layout::Manifest& manifest) const;
  // A 64-bit digest of the room's pages as this rank holds them, in a fixed order; with
  // `arena` empty, the digest of the pattern itself (what a correct arena would give).
  uint64_t Digest(const layout::Manifest& manifest, uint64_t room,
                  absl::Span<const uint8_t> arena) const;

 private:
  struct FieldRuns {
    const layout::FieldLayout* field = nullptr;
    int group_index = 0;
    uint64_t field_key = 0;
    int64_t outer = 1;                     // product of the extents before the axis
    int64_t axis_extent = 1;               // local extent on the axis (1 when replicated)
    int64_t run_bytes = 0;                 // bytes after the axis, times the element size
    std::vector<int64_t> global_of_local;  // global index of each local index on the axis
  };
  enum class Mode { kFill, kCheck, kDigest };
  absl::Status Walk(Mode mode, const layout::Manifest& manifest, uint64_t room, uint8_t* arena,
                    size_t arena_bytes, uint64_t* digest, int64_t every = 1,
                    int64_t first = 0) const;

  layout::Contract contract_;
  std::vector<FieldRuns> fields_;
};

// The toy decode step: `count` tokens in [0, 32000), each a deterministic function of the
// cache digest and the previous token.
std::vector<int32_t> ToyDecode(uint64_t digest, int count);

}  // namespace kvrail::sim

#endif  // KVRAIL_CLUSTER_KV_PATTERN_H_
