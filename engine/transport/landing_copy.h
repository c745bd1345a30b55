// The copy that puts a write's bytes where they land: into a peer's memory (a store through a
// shared-memory mapping of the peer's segment) or, at a target, out of a received message into
// the registered region it names; and the sidecar's own copies that land rows (a decode's
// scatter of staged rows into its pages). Nobody on this thread reads those bytes again: the
// peer's engine (or its GPU, or the next hop) does.
//
// Two kinds of stores, and a rule between them that is the default (TransportSpec::landing_stores,
// the sidecar's --landing-stores; docs/decisions/0018-landing-stores-by-where-rows-land.md):
//   - plain: memcpy. glibc's memcpy turns to non-temporal stores by itself for copies longer
//     than its per-host threshold (x86_non_temporal_threshold, from the CPU's cache sizes), and
//     a destination still in cache (a slot written again) is rewritten at cache speed: 2.5 times
//     as fast as streaming on the host of 2026-12-06.
//   - streaming: the 64-byte lines of the destination that the copy covers whole are written
//     with non-temporal stores, which do not read the line first. Where a plain store's
//     read-for-ownership is slow, it doubles a cold row's cost: rows into every other KiB ran
//     at 7.6 GB/s against 3.7 plain on the host of 2026-12-02, and at 15.4 GiB/s against 8.0 on
//     the host of 2026-12-07 (bench:row_landing_bench, two writers).
//   - auto (the default): streaming for rows (a LandingCopyRows of several rows that are not one
//     range at both ends: a head-sliced room's rows, which land apart with the other ranks' bytes
//     between them, or are read apart from a source row that holds other ranks' heads too, and
//     which nobody reads back soon), plain for everything else (whole slices, a single copy,
//     rows back to back at both ends, which are copied as one range). Which kind is faster for
//     rows depends on the host: on two of the three hosts measured streaming was twice as fast
//     for rows apart; on the third (2026-12-06) 1 KiB rows were 10 % slower streaming with two
//     writers and up to a fifth slower with one, smaller rows faster. Whole slices and a
//     destination in cache favour plain (LandingStoresFor; decisions 0018 and 0019).
// `bazel run -c opt //bench:row_landing_bench` and `//bench:landing_copy_bench` measure both kinds
// on a host; `kvrail bench kv --streaming-stores` runs rooms through sidecars with each.
//
// Non-temporal stores are weakly ordered: call LandingFence() after a run of LandingCopy and
// before anything that tells the reader the bytes are there (a flush's answer, a status frame).
//
// Under ThreadSanitizer the copy is always a memcpy, which TSan sees (it cannot see these
// stores), so races on landing memory stay visible to the sanitizer builds.
#ifndef KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_
#define KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_

#include <cstddef>
#include <optional>
#include <string_view>

namespace kvrail::transport {

// How LandingCopy stores (above).
enum class LandingStores { kAuto, kPlain, kStreaming };
inline constexpr LandingStores kAllLandingStores[] = {LandingStores::kAuto, LandingStores::kPlain,
                                                      LandingStores::kStreaming};
// The two kinds a store is (kAuto only chooses between them): what a bench compares.
inline constexpr LandingStores kLandingStoreKinds[] = {LandingStores::kPlain,
                                                       LandingStores::kStreaming};

// "auto", "plain" and "streaming", as --landing-stores names them, and back (nullopt for any
// other name).
const char* LandingStoresName(LandingStores stores);
std::optional<LandingStores> LandingStoresNamed(std::string_view name);

// Streamed copies below this many bytes are plain memcpy: their lines are few and often partial.
inline constexpr size_t kLandingStreamMin = 256;

// The kind a copy of `rows` rows of `length` bytes, `src_stride` apart at the source and
// `dst_stride` at the destination, stores with under `stores`: kPlain or kStreaming as given; for
// kAuto, kStreaming for rows that are not one range (rows > 1, and a stride at either end longer
// than a row), else kPlain. (Copies under kLandingStreamMin bytes are memcpy whatever this says.)
LandingStores LandingStoresFor(LandingStores stores, size_t length, size_t src_stride,
                               size_t dst_stride, size_t rows);

// Copies `n` bytes from `src` to `dst` (which must not overlap). With kStreaming, streams the
// whole 64-byte lines of `dst` past the cache when `n` >= kLandingStreamMin; kPlain and kAuto
// (one copy lands whole) copy with memcpy.
void LandingCopy(std::byte* dst, const std::byte* src, size_t n, LandingStores stores);

// Copies `rows` rows of `length` bytes each, row r from `src + r * src_stride` to
// `dst + r * dst_stride`, each row stored as LandingStoresFor(stores, length, src_stride,
// dst_stride, rows) says: a head-sliced page's rows in one call (no call per row), from a peer's
// strided write or a packed message; rows back to back at both ends are copied as one range.
// Rows must not overlap each other or the source (strides of at least `length`).
void LandingCopyRows(std::byte* dst, size_t dst_stride, const std::byte* src, size_t src_stride,
                     size_t length, size_t rows, LandingStores stores);

// One writer's slice of a run of source rows, for LandingCopySharedRows: its first row at `src`,
// `length` bytes of each row, landing at `dst` and every `dst_stride` after.
struct LandingSlice {
  std::byte* dst = nullptr;
  size_t dst_stride = 0;
  const std::byte* src = nullptr;
  size_t length = 0;
};

// Copies `rows` rows of each of `count` slices of the same source rows (`src_stride` apart), a
// source row at a time: row r of every slice, in the order given, before row r + 1 of any. Slices
// that lie back to back in each row (writes to several peers of their heads of one prefill
// rank's rows) then read each source row once, front to back, where a LandingCopyRows per slice
// reads every row once per slice and each pass drags the other slices' lines into its cache too
// (decision 0020). Each slice stores as LandingCopyRows of it alone would.
void LandingCopySharedRows(const LandingSlice* slices, size_t count, size_t src_stride, size_t rows,
                           LandingStores stores);

// Orders every earlier LandingCopy and LandingCopyRows of this thread before its later stores and
// messages (sfence on x86; a release fence elsewhere, where LandingCopy is a memcpy).
void LandingFence();

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_
