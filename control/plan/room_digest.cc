#include "control/plan/room_digest.h"

#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash picks AVX2 or AVX-512 at run time only through these entry points; the
// plain ones are its SSE2 build. Including the header makes XXH3_64bits_update dispatch.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"
#include "engine/base/rows.h"

namespace kvrail::plan {
namespace {

bool ByDestination(const Copy& a, const Copy& b) {
  return a.dst_offset != b.dst_offset ? a.dst_offset < b.dst_offset : a.length < b.length;
}

std::string Describe(const Copy& copy) {
  if (copy.rows > 1) {
    return absl::StrCat("{src ", copy.src_offset, ", dst ", copy.dst_offset, ", ", copy.rows,
                        " rows of ", copy.length, " bytes, strides ", copy.src_stride, " and ",
                        copy.dst_stride, "}");
  }
  return absl::StrCat("{src ", copy.src_offset, ", dst ", copy.dst_offset, ", ", copy.length,
                      " bytes}");
}

struct StateFree {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};

}  // namespace

absl::StatusOr<uint64_t> RoomDigest(CopyList& copies, DigestSide side,
                                    absl::Span<const uint8_t> arena) {
  const char* side_name = side == DigestSide::kSource ? "source" : "destination";
  // Every copy inside the arena on `side` (and its destination span below 2^64, for the order
  // and overlap checks below), measured the overflow-safe way (engine/base/rows.h).
  for (const Copy& c : copies) {
    RowsMeasure m;
    if (!MeasureRows(c.rows, c.length, c.src_stride, c.dst_stride, &m)) {
      return MakeError(ErrorCategory::kInvalidManifest,
                       absl::StrCat("room digest: copy ", Describe(c),
                                    " moves no byte, has rows that overlap, or passes 2^64"));
    }
    const uint64_t offset = side == DigestSide::kSource ? c.src_offset : c.dst_offset;
    const uint64_t span = side == DigestSide::kSource ? m.span_a : m.span_b;
    if (offset > arena.size() || span > arena.size() - offset ||
        c.dst_offset > std::numeric_limits<uint64_t>::max() - m.span_b) {
      return MakeError(ErrorCategory::kInvalidManifest,
                       absl::StrCat("room digest: copy ", Describe(c), " reaches past the ",
                                    side_name, " arena of ", arena.size(), " bytes"));
    }
  }
  // A copy list from the planner is mostly in destination order already (fragment by fragment,
  // pages ascending); a sort costs more than the hash of small rows, so only unsorted ones pay.
  const auto sort = [&copies] {
    if (!std::is_sorted(copies.begin(), copies.end(), ByDestination)) {
      std::sort(copies.begin(), copies.end(), ByDestination);
    }
  };
  sort();
  // A strided copy's rows are hashed in destination order among every other copy's rows. Where
  // the copies' destination spans are apart (a head-sliced page's rows a copy, as the planner
  // cuts them) that is each copy's rows in turn; where spans interleave, the copies are cut
  // into their rows first.
  bool interleaved = false;
  for (size_t i = 1; i < copies.size() && !interleaved; ++i) {
    const Copy& before = copies[i - 1];
    interleaved =
        before.rows > 1 && copies[i].dst_offset < before.dst_offset + DestinationSpan(before);
  }
  if (interleaved) {
    CopyList rows;
    for (const Copy& c : copies) {
      ForEachRow(c, [&](uint64_t src, uint64_t dst, uint64_t length) {
        rows.push_back(Copy{src, dst, length});
      });
    }
    copies = std::move(rows);
    sort();
  }
  for (size_t i = 1; i < copies.size(); ++i) {
    const Copy& before = copies[i - 1];
    if (copies[i].dst_offset < before.dst_offset + DestinationSpan(before)) {
      return MakeError(
          ErrorCategory::kInvalidManifest,
          absl::StrCat("room digest: copies ", Describe(before), " and ", Describe(copies[i]),
                       " write the same destination bytes; a room whose copies "
                       "overlap has no digest (a page named twice?)"));
    }
  }
  std::unique_ptr<XXH3_state_t, StateFree> state(XXH3_createState());
  if (state == nullptr || XXH3_64bits_reset(state.get()) == XXH_ERROR) {
    return absl::ResourceExhaustedError("room digest: cannot make an XXH3 state");
  }
  for (const Copy& c : copies) {
    ForEachRow(c, [&](uint64_t src, uint64_t dst, uint64_t length) {
      (void)XXH3_64bits_update(state.get(),
                               arena.data() + (side == DigestSide::kSource ? src : dst), length);
    });
  }
  return static_cast<uint64_t>(XXH3_64bits_digest(state.get()));
}

std::string FormatDigest(uint64_t digest) { return absl::StrFormat("0x%016x", digest); }

}  // namespace kvrail::plan
