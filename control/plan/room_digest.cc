#include "control/plan/room_digest.h"

#include <xxhash.h>
#if defined(__x86_64__)
// Debian's libxxhash picks AVX2 or AVX-512 at run time only through these entry points; the
// plain ones are its SSE2 build. Including the header makes XXH3_64bits_update dispatch.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"

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
    interleaved = before.rows > 1 && before.length != 0 &&
                  copies[i].dst_offset < before.dst_offset + DestinationSpan(before);
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
  const char* side_name = side == DigestSide::kSource ? "source" : "destination";
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    const uint64_t offset = side == DigestSide::kSource ? c.src_offset : c.dst_offset;
    const uint64_t span = c.rows == 0                   ? 0
                          : side == DigestSide::kSource ? SourceSpan(c)
                                                        : DestinationSpan(c);
    if (offset > arena.size() || span > arena.size() - offset) {
      return MakeError(ErrorCategory::kInvalidManifest,
                       absl::StrCat("room digest: copy ", Describe(c), " reaches past the ",
                                    side_name, " arena of ", arena.size(), " bytes"));
    }
    const Copy* before = i > 0 ? &copies[i - 1] : nullptr;
    if (before != nullptr && before->length != 0 && before->rows != 0 &&
        c.dst_offset < before->dst_offset + DestinationSpan(*before)) {
      return MakeError(ErrorCategory::kInvalidManifest,
                       absl::StrCat("room digest: copies ", Describe(*before), " and ", Describe(c),
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
