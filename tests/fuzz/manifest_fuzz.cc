// Fuzz harness: the manifest parser (CACHEPD §5.1), serialiser and validator (§5.3) against
// the manifests.json contract, and against the same contract with its history group sharded
// over 4 owners (§12.2, §12.8). Properties: no crash, leak or UB; rejections carry
// invalid-manifest; accepted manifests round-trip through their canonical wire; a manifest
// valid against the unsharded contract is valid against the sharded one (whose virtual block
// ids only extend the range).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "engine/base/error.h"

namespace {

using kvrail::CategoryOf;
using kvrail::ErrorCategory;

// The contract of tests/data/cachepd/manifests.json: history, a 10-token sliding window and a
// latest_snapshot state group, 64 pages each.
constexpr char kContract[] =
    R"({"plan":{"prefix_granularity":4,"lcm_block_bytes":64,"num_lcm_blocks":63,"groups":[)"
    R"({"group_id":"history","cache_blocks_per_lcm_block":1,"page_count":64},)"
    R"({"group_id":"window","cache_blocks_per_lcm_block":1,"page_count":64},)"
    R"({"group_id":"state","cache_blocks_per_lcm_block":1,"page_count":64}],"planes":[)"
    R"({"plane_id":"p0","bytes_per_lcm_block":64,"arena_offset_bytes":0},)"
    R"({"plane_id":"p1","bytes_per_lcm_block":64,"arena_offset_bytes":4096},)"
    R"({"plane_id":"p2","bytes_per_lcm_block":64,"arena_offset_bytes":8192}],"fields":[)"
    R"({"group_id":"history","field_id":"layer.0.kv","plane_id":"p0","shape":[4,8],)"
    R"("dtype":"bfloat16","field_offset_bytes":0,"page_stride_bytes":64},)"
    R"({"group_id":"window","field_id":"layer.1.kv","plane_id":"p1","shape":[4,8],)"
    R"("dtype":"bfloat16","field_offset_bytes":0,"page_stride_bytes":64},)"
    R"({"group_id":"state","field_id":"layer.2.state","plane_id":"p2","shape":[16],)"
    R"("dtype":"float32","field_offset_bytes":0,"page_stride_bytes":64}]},"group_specs":[)"
    R"({"group_id":"history","retention":"full_history","rows_per_page":4,)"
    R"("entry_stride_tokens":1,"family":"history","transfer_policy":"full_suffix"},)"
    R"({"group_id":"window","retention":"sliding_window","rows_per_page":4,)"
    R"("entry_stride_tokens":1,"sliding_window_tokens":10,"family":"history",)"
    R"("transfer_policy":"full_suffix"},)"
    R"({"group_id":"state","retention":"full_history","family":"state",)"
    R"("transfer_policy":"latest_snapshot","checkpoint_granularity":4}],)"
    R"("transfer_schema":{"fields":[]}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kvrail::layout::Contract* contract =
      new kvrail::layout::Contract(*kvrail::layout::ParseContract(kContract));
  const std::string wire(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvrail::layout::Manifest> manifest = kvrail::layout::ParseManifest(wire);
  if (!manifest.ok()) {
    if (CategoryOf(manifest.status()) != ErrorCategory::kInvalidManifest) std::abort();
    return 0;
  }
  static const kvrail::layout::Contract* sharded = [] {
    auto* c = new kvrail::layout::Contract(*contract);
    c->revision = kvrail::layout::Revision::k2026_09;
    c->group_specs[0].shard_count = 4;
    if (!kvrail::layout::ValidateContract(*c).ok()) std::abort();
    return c;
  }();
  absl::Status valid = kvrail::layout::ValidateManifest(*manifest, *contract);
  if (!valid.ok() && CategoryOf(valid) != ErrorCategory::kInvalidManifest) std::abort();
  absl::Status valid_sharded = kvrail::layout::ValidateManifest(*manifest, *sharded);
  if (!valid_sharded.ok() && CategoryOf(valid_sharded) != ErrorCategory::kInvalidManifest) {
    std::abort();
  }
  if (valid.ok() && !valid_sharded.ok()) std::abort();
  absl::StatusOr<std::string> canonical = kvrail::layout::SerializeManifest(*manifest);
  if (!canonical.ok()) return 0;
  absl::StatusOr<kvrail::layout::Manifest> again = kvrail::layout::ParseManifest(*canonical);
  if (!again.ok() || *kvrail::layout::SerializeManifest(*again) != *canonical) std::abort();
  return 0;
}
