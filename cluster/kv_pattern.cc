#include "cluster/kv_pattern.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "control/layout/dtype.h"
#include "control/plan/rank_intervals.h"
#include "engine/base/error.h"

namespace kvrail::sim {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashString(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Fills `out` with the run generated from `seed`, 8 bytes per step.
void Generate(uint64_t seed, uint8_t* out, int64_t bytes) {
  uint64_t state = seed;
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    state += 0x9e3779b97f4a7c15ull;
    const uint64_t v = Mix(state);
    std::memcpy(out + i, &v, 8);
  }
  if (i < bytes) {
    state += 0x9e3779b97f4a7c15ull;
    const uint64_t v = Mix(state);
    std::memcpy(out + i, &v, static_cast<size_t>(bytes - i));
  }
}

}  // namespace

absl::StatusOr<RankLayout> RankLayout::Create(layout::Contract contract, int tp_size, int tp_rank) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is outside TP size %d", tp_rank, tp_size));
  }
  RankLayout layout;
  layout.contract_ = std::move(contract);
  const layout::Contract& c = layout.contract_;
  for (size_t g = 0; g < c.group_specs.size(); ++g) {
    for (const layout::FieldLayout* field : c.FieldsOfGroup(c.group_specs[g].group_id)) {
      FieldRuns runs;
      runs.field = field;
      runs.group_index = static_cast<int>(g);
      runs.field_key = HashString(field->group_id + "/" + field->field_id);
      const layout::Partition* partition = c.FindPartition(field->field_id);
      const int64_t elem = layout::DTypeSize(field->dtype);
      const int axis = partition == nullptr ? -1 : static_cast<int>(partition->axis);
      int64_t inner = elem;
      for (int i = static_cast<int>(field->shape.size()) - 1; i > axis; --i) {
        inner *= field->shape[i];
      }
      for (int i = 0; i < axis; ++i) runs.outer *= field->shape[i];
      runs.run_bytes = inner;
      if (partition == nullptr) {
        runs.global_of_local = {0};
      } else {
        const int64_t local = field->shape[axis];
        runs.axis_extent = local;
        KVRAIL_ASSIGN_OR_RETURN(
            const plan::ShardMap map,
            plan::ShardMap::Create(field->field_id, *partition, local, tp_size));
        runs.global_of_local.assign(local, -1);
        for (const plan::RankInterval& interval : map.Intervals(tp_rank)) {
          for (int64_t i = 0; i < interval.length(); ++i) {
            runs.global_of_local[interval.local_offset + i] = interval.global_begin + i;
          }
        }
      }
      layout.fields_.push_back(std::move(runs));
    }
  }
  return layout;
}

absl::Status RankLayout::Walk(Mode mode, const layout::Manifest& manifest, uint64_t room,
                              uint8_t* arena, size_t arena_bytes, uint64_t* digest, int64_t every,
                              int64_t first) const {
  if (every < 1 || first < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample: every %d must be >= 1 and first %d >= 0", every, first));
  }
  std::vector<uint8_t> expected;
  uint64_t h = 0x84222325cbf29ce4ull;
  for (const FieldRuns& runs : fields_) {
    if (runs.group_index >= static_cast<int>(manifest.groups.size())) {
      return absl::InvalidArgumentError("manifest: fewer groups than the contract");
    }
    const std::vector<int64_t>& blocks = manifest.groups[runs.group_index].block_ids;
    expected.resize(static_cast<size_t>(runs.run_bytes));
    for (size_t position = static_cast<size_t>(first); position < blocks.size();
         position += static_cast<size_t>(every)) {
      KVRAIL_ASSIGN_OR_RETURN(const int64_t page,
                              layout::PageOffset(contract_, *runs.field, blocks[position]));
      for (int64_t o = 0; o < runs.outer; ++o) {
        for (int64_t l = 0; l < runs.axis_extent; ++l) {
          const uint64_t seed = Mix(
              room ^ Mix(runs.field_key ^ Mix(position ^ Mix(o ^ Mix(runs.global_of_local[l])))));
          const int64_t offset = page + (o * runs.axis_extent + l) * runs.run_bytes;
          if (arena != nullptr &&
              (offset < 0 || static_cast<uint64_t>(offset + runs.run_bytes) > arena_bytes)) {
            return absl::OutOfRangeError(
                absl::StrFormat("field %s block %d lies outside the %d-byte arena",
                                runs.field->field_id, blocks[position], arena_bytes));
          }
          switch (mode) {
            case Mode::kFill:
              Generate(seed, arena + offset, runs.run_bytes);
              break;
            case Mode::kCheck:
              Generate(seed, expected.data(), runs.run_bytes);
              if (std::memcmp(arena + offset, expected.data(), expected.size()) != 0) {
                size_t i = 0;
                while (arena[offset + i] == expected[i]) ++i;
                return absl::DataLossError(absl::StrFormat(
                    "room %d: field %s, position %d (block %d), row %d, index %d: byte %d is "
                    "0x%02x, expected 0x%02x",
                    room, runs.field->field_id, position, blocks[position], o, l, i,
                    arena[offset + i], expected[i]));
              }
              break;
            case Mode::kDigest: {
              const uint8_t* bytes = arena;
              if (bytes == nullptr) {
                Generate(seed, expected.data(), runs.run_bytes);
              }
              const uint8_t* run = bytes == nullptr ? expected.data() : bytes + offset;
              for (int64_t i = 0; i + 8 <= runs.run_bytes; i += 8) {
                uint64_t v;
                std::memcpy(&v, run + i, 8);
                h = Mix(h ^ v);
              }
              break;
            }
          }
        }
      }
    }
  }
  if (digest != nullptr) *digest = h;
  return absl::OkStatus();
}

absl::Status RankLayout::Fill(const layout::Manifest& manifest, uint64_t room,
                              absl::Span<uint8_t> arena) const {
  return Walk(Mode::kFill, manifest, room, arena.data(), arena.size(), nullptr);
}

absl::Status RankLayout::Check(const layout::Manifest& manifest, uint64_t room,
                               absl::Span<const uint8_t> arena) const {
  return Walk(Mode::kCheck, manifest, room, const_cast<uint8_t*>(arena.data()), arena.size(),
              nullptr);
}

absl::Status RankLayout::CheckSample(const layout::Manifest& manifest, uint64_t room,
                                     absl::Span<const uint8_t> arena, int64_t every,
                                     int64_t first) const {
  return Walk(Mode::kCheck, manifest, room, const_cast<uint8_t*>(arena.data()), arena.size(),
              nullptr, every, first);
}

int64_t RankLayout::Bytes(const layout::Manifest& manifest) const {
  int64_t bytes = 0;
  for (const FieldRuns& runs : fields_) {
    if (runs.group_index >= static_cast<int>(manifest.groups.size())) continue;
    const int64_t pages = static_cast<int64_t>(manifest.groups[runs.group_index].block_ids.size());
    bytes += pages * runs.outer * runs.axis_extent * runs.run_bytes;
  }
  return bytes;
}

uint64_t RankLayout::Digest(const layout::Manifest& manifest, uint64_t room,
                            absl::Span<const uint8_t> arena) const {
  uint64_t digest = 0;
  (void)Walk(Mode::kDigest, manifest, room,
             arena.empty() ? nullptr : const_cast<uint8_t*>(arena.data()), arena.size(), &digest);
  return digest;
}

std::vector<int32_t> ToyDecode(uint64_t digest, int count) {
  std::vector<int32_t> tokens;
  uint64_t state = digest;
  for (int i = 0; i < count; ++i) {
    state = Mix(state ^ static_cast<uint64_t>(i));
    tokens.push_back(static_cast<int32_t>(state % 32000));
  }
  return tokens;
}

}  // namespace kvrail::sim
