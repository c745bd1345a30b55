// Property test of the whole send path (CACHEPD §4.6, §5.2, §6, §12.6, §12.8): random but valid
// prefill/decode contract pairs are planned (Planner or the pipeline stage planners), bound and
// expanded into copies (CopyPlan), and the copies are applied to simulated arenas byte by byte.
//
// Every prefill page holds, for each local element, bytes derived from (field, source block id,
// the element's GLOBAL coordinates, byte in element), so a byte that arrives from the wrong
// field, the wrong page, the wrong shard or the wrong byte of an element does not match. For a
// page-sharded prefill group (shard_count k) the source block id is virtual: rank p's local page
// L holds virtual block (L - 1) * k + p mod k + 1, so a byte from the wrong owner or the wrong
// local page does not match either. After
// a room, each decode rank's arena must hold exactly the pattern of its own global coordinates
// in every payload byte of every page its manifest names, written exactly once, and nothing
// else may have been written.
//
// The oracle is independent of the planner: the global coordinates of a rank's local elements
// come from the §6.2 formula written out below (and are cross-checked against ShardMap).
//
// Reproducing a failure: every message names its seed; KVRAIL_ROUTE_PROPERTY_SEED=<seed> runs
// that one case in every test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/layout/contract.h"
#include "control/layout/dtype.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/pipeline.h"
#include "control/plan/planner.h"
#include "control/plan/rank_intervals.h"
#include "control/plan/route.h"

namespace kvrail::plan {
namespace {

using layout::Contract;
using layout::DType;
using layout::FieldLayout;
using layout::GroupSpec;
using layout::Manifest;

constexpr DType kDtypes[] = {
    DType::kUint8,         DType::kInt8,     DType::kFloat8E4m3fn, DType::kFloat8E5m2,
    DType::kFloat8E8m0fnu, DType::kBfloat16, DType::kFloat16,      DType::kInt32,
    DType::kFloat32,       DType::kInt64,    DType::kFloat64,
};
constexpr const char* kSuffixes[] = {"k",   "v",         "k_scale", "v_scale", "conv",
                                     "ssm", "latent_kv", "index_k", "rope_k",  "recurrent_state"};

// Distinct shard counts stay at most this, so pages stay small.
constexpr int64_t kMaxShards = 16;
// Global page payloads stay at most about this many bytes.
constexpr int64_t kMaxGlobalPageBytes = 1536;

// ---------------------------------------------------------------------------------------------
// The random model: what both peers agree on (group specs, global fields, partitions), plus
// each side's distinct shard count per partitioned field.

struct FieldModel {
  std::string id;
  int group = 0;
  DType dtype = DType::kUint8;
  std::vector<int64_t> global_shape;
  std::optional<layout::Partition> partition;
  int64_t prefill_shards = 1;  // k on the prefill side (§6.2)
  int64_t decode_shards = 1;   // k on the decode side

  // The rank-local page shape with `shards` distinct shards: G / k on the partition axis,
  // whatever the TP size (replicas hold identical data).
  std::vector<int64_t> LocalShape(int64_t shards) const {
    std::vector<int64_t> shape = global_shape;
    if (partition.has_value()) {
      shape[partition->axis] /= shards;
    }
    return shape;
  }
};

enum class CaseKind {
  kAnyTp,              // random P and D, one prefill stage
  kEqualTp,            // P == D, one stage: whole-field copy
  kPipeline,           // 2-3 prefill stages splitting the fields
  kConsecutiveBlocks,  // block ids run consecutively on both sides: copies coalesce
  kSharded,            // page-sharded prefill groups (§12.8), one stage or 2-3 stages
};

struct Model {
  CaseKind kind = CaseKind::kAnyTp;
  int prefill_tp = 1;  // per stage
  int decode_tp = 1;
  int pp = 1;
  std::vector<std::vector<int>> stage_fields;  // field indices per stage, when pp > 1
  int64_t prefix_granularity = 1;
  std::vector<GroupSpec> specs;
  std::vector<int64_t> shard_counts;  // per spec: the prefill's shard_count (§12.8); decode 1
  std::vector<FieldModel> fields;
  int64_t prefix_len = 0;
  int64_t prompt_len = 1;
  bool consecutive_blocks = false;
  // Every field in a plane of its own, pages back to back with no padding, so that copies of
  // consecutive pages can coalesce.
  bool tight_layout = false;

  int FieldIndex(const std::string& id) const {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (fields[i].id == id) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }
};

// One side's arena packing: cache_blocks_per_lcm_block per group, and the LCM block count.
struct Packing {
  std::vector<int64_t> blocks_per_lcm;
  int64_t num_lcm_blocks = 1;
};

int64_t Uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // inclusive
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

template <typename T>
const T& PickOne(std::mt19937_64& rng, const std::vector<T>& values) {
  return values[rng() % values.size()];
}

std::vector<int64_t> DivisorsUpTo(int64_t n, int64_t cap) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= std::min(n, cap); ++k) {
    if (n % k == 0) {
      out.push_back(k);
    }
  }
  return out;
}

int PickTp(std::mt19937_64& rng, int max_tp) {
  int tp;
  switch (rng() % 3) {
    case 0:
      tp = 1 << Uniform(rng, 0, 6);
      break;
    case 1:
      tp = static_cast<int>(Uniform(rng, 1, 16));
      break;
    default:
      tp = static_cast<int>(Uniform(rng, 1, 64));
      break;
  }
  return std::min(tp, max_tp);
}

int64_t Product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<int64_t>());
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

GroupSpec RandomGroupSpec(std::mt19937_64& rng, int index) {
  GroupSpec spec;
  if (rng() % 3 != 0) {
    spec.family = "history";
    spec.transfer_policy = layout::TransferPolicy::kFullSuffix;
    spec.rows_per_page = PickOne<int64_t>(rng, {1, 2, 4, 8, 16});
    spec.entry_stride_tokens = PickOne<int64_t>(rng, {1, 1, 1, 2, 4});
    if (rng() % 3 == 0) {
      spec.retention = layout::Retention::kSlidingWindow;
      spec.sliding_window_tokens = Uniform(rng, 1, 96);
      spec.group_id = absl::StrCat("swa.", index);
    } else {
      spec.retention = layout::Retention::kFullHistory;
      spec.group_id = absl::StrCat("full.", index);
    }
  } else {
    spec.family = "state";
    spec.retention = layout::Retention::kFullHistory;
    spec.transfer_policy = layout::TransferPolicy::kLatestSnapshot;
    spec.checkpoint_granularity = Uniform(rng, 1, 64);
    spec.group_id = absl::StrCat("state.", index);
  }
  return spec;
}

// A partitioned field's distinct shard counts: the same k on both sides (dividing both TP
// sizes, §6.7), or, as with GQA heads at different TP sizes, each side's own.
void PickShards(std::mt19937_64& rng, int prefill_tp, int decode_tp, FieldModel& f) {
  const std::vector<int64_t> common =
      DivisorsUpTo(std::gcd(int64_t{prefill_tp}, int64_t{decode_tp}), kMaxShards);
  if (prefill_tp != decode_tp && rng() % 2 == 0) {
    const int64_t kp = PickOne(rng, DivisorsUpTo(prefill_tp, kMaxShards));
    const int64_t kd = PickOne(rng, DivisorsUpTo(decode_tp, kMaxShards));
    if (std::lcm(kp, kd) <= kMaxShards) {
      f.prefill_shards = kp;
      f.decode_shards = kd;
      return;
    }
  }
  f.prefill_shards = f.decode_shards = PickOne(rng, common);
}

FieldModel RandomField(std::mt19937_64& rng, const Model& m, int group,
                       std::set<std::string>& ids) {
  FieldModel f;
  do {
    f.id = absl::StrCat("layer.", Uniform(rng, 0, 40), ".",
                        kSuffixes[rng() % (sizeof(kSuffixes) / sizeof(kSuffixes[0]))]);
  } while (!ids.insert(f.id).second);
  f.group = group;
  f.dtype = kDtypes[rng() % (sizeof(kDtypes) / sizeof(kDtypes[0]))];
  const int rank = static_cast<int>(Uniform(rng, 1, 3));
  for (int i = 0; i < rank; ++i) {
    f.global_shape.push_back(Uniform(rng, 1, 4));
  }
  // A page-sharded group's fields are replicated in TP (§12.8).
  if (m.shard_counts[group] == 1 && rng() % 3 != 0) {
    layout::Partition p;
    p.axis = Uniform(rng, 0, rank - 1);
    PickShards(rng, m.prefill_tp, m.decode_tp, f);
    const int64_t unit = std::lcm(f.prefill_shards, f.decode_shards);
    if (rng() % 3 == 0) {
      const int parts = static_cast<int>(Uniform(rng, 2, 4));
      for (int i = 0; i < parts; ++i) {
        p.global_parts.push_back(unit * Uniform(rng, 1, 3));
      }
      p.global_extent = std::accumulate(p.global_parts.begin(), p.global_parts.end(), int64_t{0});
    } else {
      p.global_extent = unit * Uniform(rng, 1, 4);
    }
    f.global_shape[p.axis] = p.global_extent;
    f.partition = p;
  }
  // Keep pages small: shrink the other axes while the global page is large.
  const int64_t element = layout::DTypeSize(f.dtype);
  for (int i = 0; i < rank && Product(f.global_shape) * element > kMaxGlobalPageBytes; ++i) {
    if (!f.partition.has_value() || f.partition->axis != i) {
      f.global_shape[i] = 1;
    }
  }
  return f;
}

Model RandomModel(std::mt19937_64& rng, CaseKind kind) {
  Model m;
  m.kind = kind;
  switch (kind) {
    case CaseKind::kEqualTp:
      m.prefill_tp = m.decode_tp = PickTp(rng, 64);
      break;
    case CaseKind::kConsecutiveBlocks:
      // Half equal TP, where whole pages (and so runs of pages) move.
      m.prefill_tp = PickTp(rng, 64);
      m.decode_tp = rng() % 2 == 0 ? m.prefill_tp : PickTp(rng, 64);
      break;
    case CaseKind::kPipeline:
      m.prefill_tp = PickTp(rng, 16);
      m.decode_tp = rng() % 4 == 0 ? m.prefill_tp : PickTp(rng, 64);
      break;
    case CaseKind::kSharded:
      m.prefill_tp = static_cast<int>(PickOne<int64_t>(rng, {2, 4, 6, 8, 12, 16}));
      m.decode_tp = rng() % 4 == 0 ? m.prefill_tp : PickTp(rng, 64);
      break;
    default:
      m.prefill_tp = PickTp(rng, 64);
      m.decode_tp = PickTp(rng, 64);
      break;
  }
  m.consecutive_blocks = kind == CaseKind::kConsecutiveBlocks || rng() % 8 == 0;
  m.tight_layout = kind == CaseKind::kConsecutiveBlocks || rng() % 8 == 0;

  const int groups = static_cast<int>(Uniform(rng, 1, 3));
  for (int g = 0; g < groups; ++g) {
    m.specs.push_back(RandomGroupSpec(rng, g));
  }
  m.shard_counts.assign(groups, 1);
  if (kind == CaseKind::kSharded) {
    // At least one group sharded, over a divisor k >= 2 of P.
    std::vector<int64_t> owners = DivisorsUpTo(m.prefill_tp, m.prefill_tp);
    owners.erase(owners.begin());  // 1
    for (int g = 0; g < groups; ++g) {
      if (g == 0 || rng() % 2 == 0) m.shard_counts[g] = PickOne(rng, owners);
    }
  }
  const bool pipelined =
      kind == CaseKind::kPipeline || (kind == CaseKind::kSharded && rng() % 3 == 0);
  std::set<std::string> ids;
  for (int g = 0; g < groups; ++g) {
    const int n = static_cast<int>(Uniform(rng, 1, 8));
    for (int i = 0; i < n; ++i) {
      m.fields.push_back(RandomField(rng, m, g, ids));
    }
  }
  while (pipelined && m.fields.size() < 3) {
    m.fields.push_back(RandomField(rng, m, 0, ids));
  }

  if (pipelined) {
    m.pp = static_cast<int>(Uniform(rng, 2, 3));
    m.stage_fields.assign(m.pp, {});
    std::vector<int> order(m.fields.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < order.size(); ++i) {
      // The first pp fields seed one stage each, so no stage is empty.
      const int stage =
          i < static_cast<size_t>(m.pp) ? static_cast<int>(i) : static_cast<int>(rng() % m.pp);
      m.stage_fields[stage].push_back(order[i]);
    }
  }

  // The prefix grain: a small power of two, or the LCM of the group grains.
  int64_t grains = 1;
  int64_t min_history_grain = 0;
  for (const GroupSpec& spec : m.specs) {
    grains = std::lcm(grains, spec.block_granularity());
    if (spec.rows_per_page.has_value()) {
      min_history_grain = min_history_grain == 0
                              ? spec.block_granularity()
                              : std::min(min_history_grain, spec.block_granularity());
    }
  }
  m.prefix_granularity =
      (grains <= 64 && rng() % 2 == 0) ? grains : PickOne<int64_t>(rng, {1, 2, 4, 8, 16});
  // At most about 24 blocks of the finest history group per room.
  const int64_t max_prompt = 24 * (min_history_grain == 0 ? 8 : min_history_grain);
  m.prompt_len = Uniform(rng, 1, max_prompt);
  const int64_t prefix_steps = CeilDiv(m.prompt_len, m.prefix_granularity);  // prefix < prompt
  m.prefix_len = rng() % 2 == 0 ? 0 : Uniform(rng, 0, prefix_steps - 1) * m.prefix_granularity;
  return m;
}

Packing RandomPacking(std::mt19937_64& rng, const Model& m, bool allow_packing) {
  Packing packing;
  int64_t lcm_blocks = 1;
  for (const GroupSpec& spec : m.specs) {
    const int64_t k = allow_packing && rng() % 2 == 0 ? Uniform(rng, 2, 4) : 1;
    packing.blocks_per_lcm.push_back(k);
    const int64_t needed = layout::LogicalSlots(spec, m.prefix_len, m.prompt_len).size();
    lcm_blocks = std::max(lcm_blocks, CeilDiv(needed, k));
  }
  packing.num_lcm_blocks = lcm_blocks + Uniform(rng, 0, 3);
  return packing;
}

// Lays out one rank's arena realistically (§4.6): every group has one or two planes of its own
// (one per field when tight), planes sit back to back in plane_id order, each plane's page slot
// packs its fields with random alignment and padding (none when tight), and page_stride =
// bytes_per_lcm_block / K.
Contract LayOut(std::mt19937_64& rng, const Model& m, const std::vector<int>& field_indices,
                bool decode_side, const Packing& packing) {
  Contract c;
  c.plan.prefix_granularity = m.prefix_granularity;
  c.plan.num_lcm_blocks = packing.num_lcm_blocks;
  c.group_specs = m.specs;
  if (!decode_side) {
    for (size_t g = 0; g < m.specs.size(); ++g) c.group_specs[g].shard_count = m.shard_counts[g];
  }
  for (size_t g = 0; g < m.specs.size(); ++g) {
    c.plan.groups.push_back({m.specs[g].group_id, packing.blocks_per_lcm[g],
                             1 + packing.num_lcm_blocks * packing.blocks_per_lcm[g]});
  }
  struct PlaneDraft {
    std::string id;
    int group = 0;
    std::vector<int> fields;
  };
  std::vector<PlaneDraft> planes;
  std::set<std::string> plane_ids;
  for (size_t g = 0; g < m.specs.size(); ++g) {
    std::vector<int> mine;
    for (int fi : field_indices) {
      if (m.fields[fi].group == static_cast<int>(g)) {
        mine.push_back(fi);
      }
    }
    if (mine.empty()) {
      continue;
    }
    std::shuffle(mine.begin(), mine.end(), rng);
    const size_t count =
        m.tight_layout ? mine.size() : std::min<size_t>(mine.size(), Uniform(rng, 1, 2));
    const size_t first = planes.size();
    for (size_t j = 0; j < count; ++j) {
      PlaneDraft plane;
      do {
        plane.id =
            absl::StrCat("plane.", std::string(1, static_cast<char>('a' + rng() % 26)), rng() % 10);
      } while (!plane_ids.insert(plane.id).second);
      plane.group = static_cast<int>(g);
      planes.push_back(plane);
    }
    for (size_t j = 0; j < mine.size(); ++j) {
      planes[first + (j < count ? j : rng() % count)].fields.push_back(mine[j]);
    }
  }
  std::sort(planes.begin(), planes.end(),
            [](const PlaneDraft& a, const PlaneDraft& b) { return a.id < b.id; });
  int64_t arena_offset = 0;
  for (const PlaneDraft& plane : planes) {
    const int64_t k = packing.blocks_per_lcm[plane.group];
    int64_t offset = 0;
    std::vector<FieldLayout> mine;
    for (int fi : plane.fields) {
      const FieldModel& f = m.fields[fi];
      const int64_t align = m.tight_layout ? 1 : PickOne<int64_t>(rng, {1, 2, 8, 16, 64});
      offset = CeilDiv(offset, align) * align;
      FieldLayout layout;
      layout.group_id = m.specs[f.group].group_id;
      layout.field_id = f.id;
      layout.plane_id = plane.id;
      layout.shape = f.LocalShape(decode_side ? f.decode_shards : f.prefill_shards);
      layout.dtype = f.dtype;
      layout.field_offset_bytes = offset;
      offset += layout::PayloadBytes(layout);
      if (!m.tight_layout && rng() % 3 == 0) {
        offset += Uniform(rng, 0, 31);
      }
      mine.push_back(layout);
    }
    const int64_t slot = offset + (!m.tight_layout && rng() % 3 == 0 ? Uniform(rng, 0, 63) : 0);
    for (FieldLayout& layout : mine) {
      layout.page_stride_bytes = slot;
      c.plan.fields.push_back(layout);
    }
    const int64_t bytes_per_lcm_block = k * slot;
    c.plan.planes.push_back({plane.id, bytes_per_lcm_block, arena_offset});
    arena_offset += (packing.num_lcm_blocks + 1) * bytes_per_lcm_block;
    c.plan.lcm_block_bytes += bytes_per_lcm_block;
  }
  std::shuffle(c.plan.planes.begin(), c.plan.planes.end(), rng);
  std::shuffle(c.plan.fields.begin(), c.plan.fields.end(), rng);
  for (int fi : field_indices) {
    if (m.fields[fi].partition.has_value()) {
      c.transfer_schema.push_back({m.fields[fi].id, *m.fields[fi].partition});
    }
  }
  std::shuffle(c.transfer_schema.begin(), c.transfer_schema.end(), rng);
  return c;
}

// One request's block table per group (in spec order): the slots the room carries get
// distinct ids (shuffled, or one consecutive run), the slots before them any valid id.
std::vector<std::vector<int64_t>> RandomBlockTables(std::mt19937_64& rng, const Model& m,
                                                    const Contract& c) {
  std::vector<std::vector<int64_t>> tables;
  for (size_t g = 0; g < m.specs.size(); ++g) {
    const layout::SlotRange slots = layout::LogicalSlots(m.specs[g], m.prefix_len, m.prompt_len);
    // Virtual ids for a page-sharded prefill group (§12.2); page ids otherwise.
    const int64_t pages = c.VirtualBlockCount(m.specs[g].group_id);
    std::vector<int64_t> ids(pages - 1);
    std::iota(ids.begin(), ids.end(), 1);
    const int64_t needed = slots.size();
    if (m.consecutive_blocks) {
      const int64_t start = Uniform(rng, 0, static_cast<int64_t>(ids.size()) - needed);
      ids.erase(ids.begin(), ids.begin() + start);
    } else {
      std::shuffle(ids.begin(), ids.end(), rng);
    }
    std::vector<int64_t> table(std::max<int64_t>(slots.end, 0));
    for (int64_t slot = 0; slot < slots.end; ++slot) {
      table[slot] = slot < slots.begin ? Uniform(rng, 1, pages - 1) : ids[slot - slots.begin];
    }
    tables.push_back(std::move(table));
  }
  return tables;
}

// ---------------------------------------------------------------------------------------------
// The oracle.

uint8_t PatternByte(uint64_t field, int64_t block, int64_t global_element, int64_t byte) {
  uint64_t x = (field << 56) ^ (static_cast<uint64_t>(block) << 34) ^
               (static_cast<uint64_t>(global_element) << 4) ^ static_cast<uint64_t>(byte);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint8_t>(x);
}

// §6.2 written out: the global index of every local index on the partition axis of a rank of
// a side with TP size `tp` and `shards` distinct shards.
std::vector<int64_t> AxisToGlobal(const FieldModel& f, int64_t shards, int tp, int rank) {
  const layout::Partition& p = *f.partition;
  const int64_t replicas = tp / shards;
  const int64_t shard = rank / replicas;
  std::vector<int64_t> parts = p.global_parts;
  if (parts.empty()) {
    parts.push_back(p.global_extent);
  }
  std::vector<int64_t> out;
  int64_t global_offset = 0;
  for (int64_t part : parts) {
    const int64_t local = part / shards;
    for (int64_t i = 0; i < local; ++i) {
      out.push_back(global_offset + shard * local + i);
    }
    global_offset += part;
  }
  return out;
}

// For every local element (row-major) of a rank's page of `f`: its row-major index in the
// field's global shape.
std::vector<int64_t> GlobalElementOfLocal(const FieldModel& f, int64_t shards, int tp, int rank) {
  const std::vector<int64_t> local = f.LocalShape(shards);
  const size_t dims = local.size();
  std::vector<int64_t> axis_map;
  if (f.partition.has_value()) {
    axis_map = AxisToGlobal(f, shards, tp, rank);
  }
  std::vector<int64_t> global_stride(dims, 1);
  for (size_t i = dims - 1; i > 0; --i) {
    global_stride[i - 1] = global_stride[i] * f.global_shape[i];
  }
  std::vector<int64_t> out(Product(local));
  std::vector<int64_t> coord(dims, 0);
  for (int64_t& global : out) {
    global = 0;
    for (size_t i = 0; i < dims; ++i) {
      const bool on_axis = f.partition.has_value() && static_cast<int64_t>(i) == f.partition->axis;
      global += (on_axis ? axis_map[coord[i]] : coord[i]) * global_stride[i];
    }
    for (size_t i = dims; i-- > 0;) {
      if (++coord[i] < local[i]) {
        break;
      }
      coord[i] = 0;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// One case.

struct Stats {
  int cases = 0;
  int heterogeneous_tp = 0;
  int whole_field_routes = 0;
  int pipeline_cases = 0;
  int partitioned_fields = 0;
  int fields_with_parts = 0;
  int fields_with_unequal_shards = 0;
  int packed_sides = 0;
  int sliding_window_groups = 0;
  int snapshot_groups = 0;
  int groups_sharded = 0;
  int nonzero_prefix = 0;
  int64_t copies = 0;
  int64_t coalesced_copies = 0;
  int whole_field_runs_merged = 0;  // whole-field sends that coalesced to one copy per field
  int64_t bytes_checked = 0;
};

class CaseRunner {
 public:
  CaseRunner(uint64_t seed, CaseKind kind, Stats& stats)
      : seed_(seed), kind_(kind), rng_(seed), stats_(stats) {}

  void Run();

 private:
  // Records one failure (at most a few per case) with the seed and the case's inputs.
  void Fail(const std::string& message) {
    ++failures_;
    if (failures_ <= 5) {
      ADD_FAILURE() << "seed=" << seed_ << ": " << message
                    << (failures_ == 1 ? "\n" + Describe() : std::string());
    }
  }
  bool Failed() const { return failures_ > 0; }
  std::string Describe() const;

  // The arena of prefill rank `global_rank` (TP rank `tp_rank` of the stage whose contract is
  // `contract`), filled on first use.
  const std::vector<uint8_t>* PrefillArena(int global_rank, int tp_rank, const Contract& contract);
  void CheckShardMap(const FieldModel& f, int64_t shards, int tp, int rank, int64_t local_extent);
  // Binds, expands and applies one source's fragments to decode rank d's arenas.
  void Send(int d, int global_rank, int tp_rank, const Contract& source_contract,
            const std::vector<Fragment>& fragments,
            const std::vector<GroupOwnerFilter>& owner_filters);
  void CheckDecodeArena(int d);
  void RunOneStage();
  void RunPipeline();

  const uint64_t seed_;
  const CaseKind kind_;
  std::mt19937_64 rng_;
  Stats& stats_;
  int failures_ = 0;

  Model m_;
  Contract prefill_;             // the wire contract (the whole model)
  std::vector<Contract> stage_;  // pipeline: each stage's local contract
  Contract decode_;
  Manifest prefill_manifest_;
  Manifest decode_manifest_;
  std::map<int, std::vector<uint8_t>> prefill_arenas_;

  // Decode rank d under test: coalesced and uncoalesced application, and write counts.
  std::vector<uint8_t> arena_;
  std::vector<uint8_t> writes_;
  std::vector<uint8_t> arena_raw_;
  std::vector<uint8_t> writes_raw_;
  CopyList copies_;
  CopyList coalesced_;
};

std::string CaseRunner::Describe() const {
  std::ostringstream os;
  os << "  case: P=" << m_.prefill_tp << " D=" << m_.decode_tp << " pp=" << m_.pp
     << " prefix_len=" << m_.prefix_len << " prompt_len=" << m_.prompt_len
     << " prefix_granularity=" << m_.prefix_granularity << " shard_counts=["
     << absl::StrJoin(m_.shard_counts, ",") << "]\n";
  for (const FieldModel& f : m_.fields) {
    os << "  field " << f.id << " group=" << m_.specs[f.group].group_id
       << " dtype=" << layout::DTypeName(f.dtype) << " global_shape=["
       << absl::StrJoin(f.global_shape, ",") << "]";
    if (f.partition.has_value()) {
      os << " axis=" << f.partition->axis << " G=" << f.partition->global_extent << " parts=["
         << absl::StrJoin(f.partition->global_parts, ",") << "] k_prefill=" << f.prefill_shards
         << " k_decode=" << f.decode_shards;
    } else {
      os << " replicated";
    }
    os << "\n";
  }
  for (int s = 0; s < m_.pp && m_.pp > 1; ++s) {
    std::vector<std::string> ids;
    for (int fi : m_.stage_fields[s]) {
      ids.push_back(m_.fields[fi].id);
    }
    os << "  stage " << s << ": " << absl::StrJoin(ids, ",") << "\n";
  }
  absl::StatusOr<std::string> pw = layout::SerializeContract(prefill_);
  absl::StatusOr<std::string> dw = layout::SerializeContract(decode_);
  absl::StatusOr<std::string> pm = layout::SerializeManifest(prefill_manifest_);
  absl::StatusOr<std::string> dm = layout::SerializeManifest(decode_manifest_);
  os << "  prefill contract: " << (pw.ok() ? *pw : pw.status().ToString()) << "\n";
  os << "  decode contract: " << (dw.ok() ? *dw : dw.status().ToString()) << "\n";
  os << "  prefill manifest: " << (pm.ok() ? *pm : pm.status().ToString()) << "\n";
  os << "  decode manifest: " << (dm.ok() ? *dm : dm.status().ToString());
  return os.str();
}

void CaseRunner::CheckShardMap(const FieldModel& f, int64_t shards, int tp, int rank,
                               int64_t local_extent) {
  absl::StatusOr<ShardMap> map = ShardMap::Create(f.id, *f.partition, local_extent, tp);
  if (!map.ok()) {
    Fail(absl::StrCat("ShardMap::Create(", f.id, ", TP=", tp,
                      ") failed: ", map.status().ToString()));
    return;
  }
  const std::vector<int64_t> oracle = AxisToGlobal(f, shards, tp, rank);
  std::vector<int64_t> got(oracle.size(), -1);
  for (const RankInterval& interval : map->Intervals(rank)) {
    for (int64_t i = 0; i < interval.length(); ++i) {
      const int64_t local = interval.local_offset + i;
      if (local >= 0 && local < static_cast<int64_t>(got.size())) {
        got[local] = interval.global_begin + i;
      }
    }
  }
  if (got != oracle) {
    Fail(absl::StrCat("ShardMap intervals of field ", f.id, " rank ", rank, " of TP=", tp,
                      " map local indices to [", absl::StrJoin(got, ","), "], §6.2 says [",
                      absl::StrJoin(oracle, ","), "]"));
  }
}

const std::vector<uint8_t>* CaseRunner::PrefillArena(int global_rank, int tp_rank,
                                                     const Contract& contract) {
  auto it = prefill_arenas_.find(global_rank);
  if (it != prefill_arenas_.end()) {
    return &it->second;
  }
  std::vector<uint8_t>& arena = prefill_arenas_[global_rank];
  arena.resize(contract.ArenaBytes());
  // Bytes outside every payload: noise that no pattern is derived from.
  std::mt19937_64 noise(seed_ ^ (0x9e3779b97f4a7c15ULL * (global_rank + 1)));
  for (uint8_t& byte : arena) {
    byte = static_cast<uint8_t>(noise());
  }
  std::vector<bool> owned(arena.size(), false);
  for (const FieldLayout& layout : contract.plan.fields) {
    const int fi = m_.FieldIndex(layout.field_id);
    const FieldModel& f = m_.fields[fi];
    if (f.partition.has_value()) {
      CheckShardMap(f, f.prefill_shards, m_.prefill_tp, tp_rank, layout.shape[f.partition->axis]);
    }
    const std::vector<int64_t> global =
        GlobalElementOfLocal(f, f.prefill_shards, m_.prefill_tp, tp_rank);
    const int64_t element = layout::DTypeSize(f.dtype);
    const int64_t pages = contract.FindGroup(layout.group_id)->page_count;
    const int64_t k = contract.FindGroupSpec(layout.group_id)->shard_count;
    for (int64_t page = 0; page < pages; ++page) {
      const int64_t offset = *layout::PageOffset(contract, layout, page);
      // The block this page holds: a virtual id for a page-sharded group (§12.8).
      const int64_t block = page == 0 ? 0 : (page - 1) * k + tp_rank % k + 1;
      for (size_t e = 0; e < global.size(); ++e) {
        for (int64_t b = 0; b < element; ++b) {
          const size_t at = static_cast<size_t>(offset + static_cast<int64_t>(e) * element + b);
          if (owned[at]) {
            Fail(absl::StrCat("test generator bug: prefill payloads overlap at byte ", at));
            return nullptr;
          }
          owned[at] = true;
          arena[at] = PatternByte(fi, block, global[e], b);
        }
      }
    }
  }
  return &arena;
}

void CaseRunner::Send(int d, int global_rank, int tp_rank, const Contract& source_contract,
                      const std::vector<Fragment>& fragments,
                      const std::vector<GroupOwnerFilter>& owner_filters) {
  const std::string where = absl::StrCat("prefill rank ", global_rank, " -> decode rank ", d);
  absl::StatusOr<CopyPlan> plan =
      CopyPlan::Bind(source_contract, decode_, fragments, owner_filters);
  if (!plan.ok()) {
    Fail(absl::StrCat(where, ": CopyPlan::Bind failed: ", plan.status().ToString()));
    return;
  }
  copies_.clear();
  absl::Status expanded = plan->Expand(prefill_manifest_, decode_manifest_, copies_);
  if (!expanded.ok()) {
    Fail(absl::StrCat(where, ": Expand failed: ", expanded.ToString()));
    return;
  }
  if (plan->CountCopies(prefill_manifest_) != static_cast<int64_t>(copies_.size())) {
    Fail(absl::StrCat(where, ": CountCopies says ", plan->CountCopies(prefill_manifest_),
                      ", Expand appended ", copies_.size()));
  }
  const std::vector<uint8_t>* src = PrefillArena(global_rank, tp_rank, source_contract);
  if (src == nullptr) {
    return;
  }
  auto apply = [&](const CopyList& copies, std::vector<uint8_t>& dst, std::vector<uint8_t>& writes,
                   const char* which) {
    for (const Copy& c : copies) {
      if (c.length == 0 || c.src_offset + c.length > src->size() ||
          c.dst_offset + c.length > dst.size()) {
        Fail(absl::StrCat(where, ": ", which, " copy {src=", c.src_offset, ", dst=", c.dst_offset,
                          ", len=", c.length, "} is empty or leaves the arenas (prefill ",
                          src->size(), " bytes, decode ", dst.size(), " bytes)"));
        return;
      }
      std::memcpy(&dst[c.dst_offset], &(*src)[c.src_offset], c.length);
      for (uint64_t i = 0; i < c.length; ++i) {
        uint8_t& count = writes[c.dst_offset + i];
        if (count < 255) {
          ++count;
        }
      }
    }
  };
  apply(copies_, arena_raw_, writes_raw_, "uncoalesced");
  stats_.copies += static_cast<int64_t>(copies_.size());
  const size_t left = Coalesce(copies_);
  // The sender's hot path coalesces while it expands; it must give the same list.
  coalesced_.clear();
  absl::Status fast = plan->ExpandCoalesced(prefill_manifest_, decode_manifest_, coalesced_);
  if (!fast.ok() || !(coalesced_ == copies_)) {
    Fail(absl::StrCat(where, ": ExpandCoalesced differs from Expand + Coalesce (",
                      coalesced_.size(), " vs ", copies_.size(), " copies)"));
  }
  stats_.coalesced_copies += static_cast<int64_t>(left);
  if (plan->whole_field() && m_.consecutive_blocks && m_.tight_layout) {
    // Pages back to back on both sides and block ids consecutive on both sides: each field's
    // pages of a room are one run on each side, so they must coalesce into (at most) one copy
    // per kMostMergedBytes of pages.
    size_t runs = 0;
    for (const BoundFragment& b : plan->fragments()) {
      const size_t blocks = prefill_manifest_.groups[b.group_index].block_ids.size();
      const uint64_t page = static_cast<uint64_t>(b.rows * b.bytes_per_row);
      const size_t per_run = std::max<size_t>(1, kMostMergedBytes / std::max<uint64_t>(page, 1));
      runs += (blocks + per_run - 1) / per_run;
    }
    if (left > runs) {
      Fail(absl::StrCat(where, ": whole-field copy of consecutive pages coalesced to ", left,
                        " copies, expected at most one per field and per ", kMostMergedBytes,
                        " bytes of it (", runs, ")"));
    }
    ++stats_.whole_field_runs_merged;
  }
  apply(copies_, arena_, writes_, "coalesced");
}

void CaseRunner::CheckDecodeArena(int d) {
  const size_t n = arena_.size();
  std::vector<uint8_t> expected(n, 0);
  std::vector<int32_t> owner(n, -1);  // the field whose needed payload holds the byte
  std::vector<int64_t> page_of(n, -1);
  for (size_t g = 0; g < decode_manifest_.groups.size(); ++g) {
    const std::vector<int64_t>& dst_ids = decode_manifest_.groups[g].block_ids;
    const std::vector<int64_t>& src_ids = prefill_manifest_.groups[g].block_ids;
    for (const FieldLayout* layout : decode_.FieldsOfGroup(m_.specs[g].group_id)) {
      const int fi = m_.FieldIndex(layout->field_id);
      const FieldModel& f = m_.fields[fi];
      if (f.partition.has_value()) {
        CheckShardMap(f, f.decode_shards, m_.decode_tp, d, layout->shape[f.partition->axis]);
      }
      const std::vector<int64_t> global = GlobalElementOfLocal(f, f.decode_shards, m_.decode_tp, d);
      const int64_t element = layout::DTypeSize(f.dtype);
      for (size_t i = 0; i < dst_ids.size(); ++i) {
        const int64_t offset = *layout::PageOffset(decode_, *layout, dst_ids[i]);
        for (size_t e = 0; e < global.size(); ++e) {
          for (int64_t b = 0; b < element; ++b) {
            const size_t at = static_cast<size_t>(offset + static_cast<int64_t>(e) * element + b);
            if (owner[at] != -1) {
              Fail(absl::StrCat("test generator bug: decode payloads overlap at byte ", at));
              return;
            }
            owner[at] = fi;
            page_of[at] = dst_ids[i];
            expected[at] = PatternByte(fi, src_ids[i], global[e], b);
          }
        }
      }
    }
  }
  for (size_t at = 0; at < n; ++at) {
    if (arena_[at] != arena_raw_[at] || writes_[at] != writes_raw_[at]) {
      Fail(absl::StrCat("decode rank ", d, " byte ", at, ": coalescing changed the result: ",
                        int{arena_[at]}, " written ", int{writes_[at]}, "x coalesced vs ",
                        int{arena_raw_[at]}, " written ", int{writes_raw_[at]}, "x uncoalesced"));
      return;
    }
    if (owner[at] == -1) {
      if (writes_[at] != 0) {
        Fail(absl::StrCat("decode rank ", d, " byte ", at,
                          " lies outside every needed payload but was written ", int{writes_[at]},
                          " times"));
        return;
      }
      continue;
    }
    ++stats_.bytes_checked;
    if (writes_[at] != 1 || arena_[at] != expected[at]) {
      const FieldLayout* layout = decode_.FindField(m_.fields[owner[at]].id);
      const int64_t page_start = *layout::PageOffset(decode_, *layout, page_of[at]);
      Fail(absl::StrCat("decode rank ", d, " field ", layout->field_id, " block ", page_of[at],
                        " payload byte ", static_cast<int64_t>(at) - page_start, " (arena byte ",
                        at, "): written ", int{writes_[at]}, " times, holds ", int{arena_[at]},
                        ", expected ", int{expected[at]}));
      return;
    }
  }
}

void CaseRunner::RunOneStage() {
  absl::StatusOr<Planner> planner = Planner::Create(m_.prefill_tp, m_.decode_tp, prefill_, decode_);
  if (!planner.ok()) {
    Fail(absl::StrCat("Planner::Create failed: ", planner.status().ToString()));
    return;
  }
  for (int d = 0; d < m_.decode_tp && !Failed(); ++d) {
    absl::StatusOr<Route> route = planner->PlanForDecodeRank(d);
    if (!route.ok()) {
      Fail(absl::StrCat("PlanForDecodeRank(", d, ") failed: ", route.status().ToString()));
      return;
    }
    const bool sharded = !planner->sharded_group_ids().empty();
    if (route->whole_field_copy != (m_.prefill_tp == m_.decode_tp && !sharded)) {
      Fail(absl::StrCat("decode rank ", d, ": whole_field_copy is ", route->whole_field_copy,
                        " with P=", m_.prefill_tp, " D=", m_.decode_tp, " sharded=", sharded));
    }
    const absl::Status covered = ValidateOwnerCoverage(RangeSendersOf(*route), prefill_);
    if (!covered.ok()) {
      Fail(absl::StrCat("decode rank ", d, ": ", covered.ToString()));
    }
    stats_.whole_field_routes += route->whole_field_copy ? 1 : 0;
    absl::StatusOr<DecodeTargets> targets = planner->TargetsFor(d);
    if (!targets.ok() || targets->expected_prefill_ranks != route->PrefillRanks()) {
      Fail(absl::StrCat("decode rank ", d, ": TargetsFor disagrees with the route's sources"));
    }
    arena_.assign(decode_.ArenaBytes(), 0);
    writes_.assign(arena_.size(), 0);
    arena_raw_ = arena_;
    writes_raw_ = writes_;
    for (const SourceFragments& source : route->sources) {
      const int p = source.prefill_rank;
      const std::vector<int>& served = planner->DecodeRanksServedBy(p);
      if (!std::binary_search(served.begin(), served.end(), d)) {
        Fail(absl::StrCat("prefill rank ", p, " is a source of decode rank ", d, " but S_p = [",
                          absl::StrJoin(served, ","), "] lacks it"));
      }
      // What the prefill sends is what it decides on the registration (§6.8).
      RegistrationOutcome outcome = planner->OnRegistration(p, d);
      if (outcome.kind != RegistrationOutcome::Kind::kSend ||
          outcome.fragments != source.fragments || outcome.owner_filters != source.owner_filters) {
        Fail(absl::StrCat("prefill rank ", p, " answers decode rank ", d, "'s registration with ",
                          OutcomeName(outcome.kind), " and ", outcome.fragments.size(),
                          " fragments; the decode's route has ", source.fragments.size(),
                          " (or other owner filters)"));
        return;
      }
      Send(d, p, p, prefill_, outcome.fragments, outcome.owner_filters);
      if (Failed()) {
        return;
      }
    }
    CheckDecodeArena(d);
  }
}

void CaseRunner::RunPipeline() {
  PipelineLayout layout;
  layout.pp_size = m_.pp;
  for (const std::vector<int>& fields : m_.stage_fields) {
    layout.fields_by_stage.emplace_back();
    for (int fi : fields) {
      layout.fields_by_stage.back().push_back(m_.fields[fi].id);
    }
  }
  std::vector<Planner> planners;
  for (int s = 0; s < m_.pp; ++s) {
    absl::StatusOr<Planner> planner =
        CreateStagePlanner(layout, s, m_.prefill_tp, m_.decode_tp, prefill_, decode_);
    if (!planner.ok()) {
      Fail(absl::StrCat("CreateStagePlanner(stage ", s, ") failed: ", planner.status().ToString()));
      return;
    }
    planners.push_back(*std::move(planner));
  }
  for (int d = 0; d < m_.decode_tp && !Failed(); ++d) {
    absl::StatusOr<PipelineRoute> route =
        PlanPipelineRoute(layout, m_.prefill_tp, m_.decode_tp, d, prefill_, decode_);
    if (!route.ok()) {
      Fail(absl::StrCat("PlanPipelineRoute(", d, ") failed: ", route.status().ToString()));
      return;
    }
    if (route->whole_field_copy) {
      Fail(absl::StrCat("decode rank ", d, ": a ", m_.pp, "-stage route is a whole-field copy"));
    }
    arena_.assign(decode_.ArenaBytes(), 0);
    writes_.assign(arena_.size(), 0);
    arena_raw_ = arena_;
    writes_raw_ = writes_;
    for (const PipelineSource& source : route->sources) {
      if (source.prefill_rank !=
          GlobalPrefillRank(source.stage, m_.prefill_tp, source.stage_tp_rank)) {
        Fail(absl::StrCat("decode rank ", d, ": source (stage ", source.stage, ", rank ",
                          source.stage_tp_rank, ") has global id ", source.prefill_rank));
      }
      RegistrationOutcome outcome = planners[source.stage].OnRegistration(source.stage_tp_rank, d);
      if (outcome.kind != RegistrationOutcome::Kind::kSend ||
          outcome.fragments != source.fragments || outcome.fragments.empty() ||
          outcome.owner_filters != source.owner_filters) {
        Fail(absl::StrCat("stage ", source.stage, " rank ", source.stage_tp_rank,
                          " answers decode rank ", d, "'s registration with ",
                          OutcomeName(outcome.kind), " and ", outcome.fragments.size(),
                          " fragments; the decode's route has ", source.fragments.size()));
        return;
      }
      // The stage sends from its own arena, laid out by its local contract (§10.1).
      Send(d, source.prefill_rank, source.stage_tp_rank, stage_[source.stage], outcome.fragments,
           outcome.owner_filters);
      if (Failed()) {
        return;
      }
    }
    CheckDecodeArena(d);
  }
}

void CaseRunner::Run() {
  m_ = RandomModel(rng_, kind_);
  // At most one side packs several cache blocks per LCM block, so the geometries differ.
  const bool pack_prefill = rng_() % 2 == 0;
  const Packing prefill_packing = RandomPacking(rng_, m_, pack_prefill);
  const Packing decode_packing = RandomPacking(rng_, m_, !pack_prefill);
  std::vector<int> all(m_.fields.size());
  std::iota(all.begin(), all.end(), 0);
  prefill_ = LayOut(rng_, m_, all, false, prefill_packing);
  decode_ = LayOut(rng_, m_, all, true, decode_packing);
  for (int s = 0; s < m_.pp && m_.pp > 1; ++s) {
    // Every stage pages the same block table (same page counts) with its own planes.
    stage_.push_back(LayOut(rng_, m_, m_.stage_fields[s], false, prefill_packing));
  }
  std::vector<const Contract*> contracts = {&prefill_, &decode_};
  for (const Contract& c : stage_) {
    contracts.push_back(&c);
  }
  for (const Contract* c : contracts) {
    absl::Status valid = layout::ValidateContract(*c);
    if (valid.ok()) {
      valid = layout::CheckArenaFits(*c);
    }
    if (!valid.ok()) {
      Fail(absl::StrCat("test generator bug: invalid contract: ", valid.ToString()));
      return;
    }
  }
  absl::Status peers = layout::CheckPeerContracts(prefill_, decode_);
  if (!peers.ok()) {
    Fail(absl::StrCat("test generator bug: CheckPeerContracts: ", peers.ToString()));
    return;
  }
  absl::StatusOr<Manifest> pm = layout::BuildManifest(
      prefill_, RandomBlockTables(rng_, m_, prefill_), m_.prefix_len, m_.prompt_len);
  absl::StatusOr<Manifest> dm = layout::BuildManifest(decode_, RandomBlockTables(rng_, m_, decode_),
                                                      m_.prefix_len, m_.prompt_len);
  if (!pm.ok() || !dm.ok()) {
    Fail(absl::StrCat("test generator bug: BuildManifest: ", pm.status().ToString(), " / ",
                      dm.status().ToString()));
    return;
  }
  prefill_manifest_ = *std::move(pm);
  decode_manifest_ = *std::move(dm);
  absl::Status valid = layout::ValidateManifest(decode_manifest_, decode_);
  if (!valid.ok()) {
    Fail(absl::StrCat("test generator bug: decode manifest: ", valid.ToString()));
    return;
  }

  ++stats_.cases;
  stats_.heterogeneous_tp += m_.prefill_tp != m_.decode_tp ? 1 : 0;
  stats_.pipeline_cases += m_.pp > 1 ? 1 : 0;
  stats_.nonzero_prefix += m_.prefix_len > 0 ? 1 : 0;
  for (const FieldModel& f : m_.fields) {
    if (!f.partition.has_value()) {
      continue;
    }
    ++stats_.partitioned_fields;
    stats_.fields_with_parts += f.partition->global_parts.empty() ? 0 : 1;
    stats_.fields_with_unequal_shards += f.prefill_shards != f.decode_shards ? 1 : 0;
  }
  for (const Packing* packing : {&prefill_packing, &decode_packing}) {
    for (int64_t k : packing->blocks_per_lcm) {
      if (k > 1) {
        ++stats_.packed_sides;
        break;
      }
    }
  }
  for (const GroupSpec& spec : m_.specs) {
    stats_.sliding_window_groups += spec.retention == layout::Retention::kSlidingWindow ? 1 : 0;
    stats_.snapshot_groups +=
        spec.transfer_policy == layout::TransferPolicy::kLatestSnapshot ? 1 : 0;
  }
  for (int64_t k : m_.shard_counts) stats_.groups_sharded += k > 1 ? 1 : 0;

  if (m_.pp > 1) {
    RunPipeline();
  } else {
    RunOneStage();
  }
}

// ---------------------------------------------------------------------------------------------

// Runs `count` cases of `kind` from consecutive seeds (or the one seed the environment names).
Stats RunCases(CaseKind kind, uint64_t first_seed, int count) {
  Stats stats;
  std::vector<uint64_t> seeds;
  if (const char* only = std::getenv("KVRAIL_ROUTE_PROPERTY_SEED"); only != nullptr) {
    seeds.push_back(std::strtoull(only, nullptr, 10));
  } else {
    for (int i = 0; i < count; ++i) {
      seeds.push_back(first_seed + static_cast<uint64_t>(i));
    }
  }
  int failing = 0;
  for (uint64_t seed : seeds) {
    const int before =
        ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    CaseRunner(seed, kind, stats).Run();
    const int after =
        ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    if (after != before && ++failing >= 3) {
      ADD_FAILURE() << "stopping after 3 failing seeds";
      break;
    }
  }
  std::cout << "cases=" << stats.cases << " heterogeneous_tp=" << stats.heterogeneous_tp
            << " whole_field_routes=" << stats.whole_field_routes
            << " pipeline=" << stats.pipeline_cases
            << " partitioned_fields=" << stats.partitioned_fields
            << " with_parts=" << stats.fields_with_parts
            << " unequal_shards=" << stats.fields_with_unequal_shards
            << " packed_sides=" << stats.packed_sides
            << " sliding_window_groups=" << stats.sliding_window_groups
            << " snapshot_groups=" << stats.snapshot_groups
            << " groups_sharded=" << stats.groups_sharded
            << " nonzero_prefix=" << stats.nonzero_prefix << " copies=" << stats.copies
            << " coalesced=" << stats.coalesced_copies
            << " whole_field_runs_merged=" << stats.whole_field_runs_merged
            << " bytes_checked=" << stats.bytes_checked << "\n";
  return stats;
}

bool SingleSeed() { return std::getenv("KVRAIL_ROUTE_PROPERTY_SEED") != nullptr; }

TEST(RoutePropertyTest, EveryDecodeByteArrivesExactlyOnceFromARankHoldingIt) {
  const Stats stats = RunCases(CaseKind::kAnyTp, 1000, 300);
  if (SingleSeed()) {
    return;
  }
  // The generator reached the shapes the property is about.
  EXPECT_GT(stats.heterogeneous_tp, 100);
  EXPECT_GT(stats.fields_with_parts, 20);
  EXPECT_GT(stats.fields_with_unequal_shards, 20);
  EXPECT_GT(stats.packed_sides, 50);
  EXPECT_GT(stats.sliding_window_groups, 20);
  EXPECT_GT(stats.snapshot_groups, 20);
  EXPECT_GT(stats.nonzero_prefix, 50);
  EXPECT_GT(stats.bytes_checked, 0);
}

TEST(RoutePropertyTest, EqualTpWholeFieldCopyDeliversEveryByteExactlyOnce) {
  const Stats stats = RunCases(CaseKind::kEqualTp, 2000, 60);
  if (SingleSeed()) {
    return;
  }
  EXPECT_EQ(stats.heterogeneous_tp, 0);
  EXPECT_GT(stats.whole_field_routes, 50);
}

TEST(RoutePropertyTest, PipelineStagesTogetherDeliverEveryByteExactlyOnce) {
  const Stats stats = RunCases(CaseKind::kPipeline, 3000, 100);
  if (SingleSeed()) {
    return;
  }
  EXPECT_EQ(stats.pipeline_cases, stats.cases);
  EXPECT_EQ(stats.whole_field_routes, 0);
}

// §12.8: a page-sharded group's blocks come from every owner of the subgroup, each block (a
// virtual id) from the owner holding it at its local page, once; at equal TP too.
TEST(RoutePropertyTest, ShardedGroupsDeliverEveryBlockExactlyOnceFromItsOwner) {
  const Stats stats = RunCases(CaseKind::kSharded, 5000, 150);
  if (SingleSeed()) {
    return;
  }
  EXPECT_GE(stats.groups_sharded, stats.cases);
  EXPECT_GT(stats.pipeline_cases, 20);
  EXPECT_GT(stats.heterogeneous_tp, 50);
  EXPECT_EQ(stats.whole_field_routes, 0);
  EXPECT_GT(stats.bytes_checked, 0);
}

TEST(RoutePropertyTest, CoalescingConsecutivePagesNeverChangesTheBytesWritten) {
  // CheckDecodeArena compares the coalesced and uncoalesced results byte for byte.
  const Stats stats = RunCases(CaseKind::kConsecutiveBlocks, 4000, 60);
  if (SingleSeed()) {
    return;
  }
  EXPECT_LT(stats.coalesced_copies, stats.copies);
  EXPECT_GT(stats.whole_field_runs_merged, 100);
}

}  // namespace
}  // namespace kvrail::plan
