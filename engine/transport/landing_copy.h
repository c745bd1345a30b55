// The copy that puts a write's bytes where they land: into a peer's memory (a store through a
// shared-memory mapping of the peer's segment) or, at a target, out of a received message into
// the registered region it names. Nobody on this thread reads those bytes again: the peer's
// engine (or its GPU, or the next hop) does.
//
// Two kinds of stores, chosen per transport (TransportSpec::landing_stores, the sidecar's
// --landing-stores), because which is faster depends on the host, measured with
// `bazel run -c opt //bench:landing_copy_bench` (docs/decisions/0017-landing-stores-per-host.md):
//   - plain: memcpy. glibc's memcpy turns to non-temporal stores by itself for copies longer
//     than its per-host threshold (x86_non_temporal_threshold, from the CPU's cache sizes), and
//     a destination still in cache (a slot written again) is rewritten at cache speed. The
//     default: on the host the project measures on now (2026-12-06) it is faster for rows into
//     cold pages (1 KiB rows into every other KiB: 11.4-12.5 GB/s against 9.8 streaming), within
//     noise of streaming for larger copies, and 2.5 times as fast into a destination in cache.
//   - streaming: the 64-byte lines of the destination that the copy covers whole are written
//     with non-temporal stores, which do not read the line first. Where a plain store's
//     read-for-ownership is slow, it doubles a cold 1 KiB row's cost: on the host of 2026-12-02,
//     3.7 GB/s plain against 7.6 streaming (docs/benchmarks-history.md, "Landing copies").
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
enum class LandingStores { kPlain, kStreaming };
inline constexpr LandingStores kAllLandingStores[] = {LandingStores::kPlain,
                                                      LandingStores::kStreaming};

// "plain" and "streaming", as --landing-stores names them, and back (nullopt for any other
// name).
const char* LandingStoresName(LandingStores stores);
std::optional<LandingStores> LandingStoresNamed(std::string_view name);

// Streamed copies below this many bytes are plain memcpy: their lines are few and often partial.
inline constexpr size_t kLandingStreamMin = 256;

// Copies `n` bytes from `src` to `dst` (which must not overlap). With kStreaming, streams the
// whole 64-byte lines of `dst` past the cache when `n` >= kLandingStreamMin; kPlain copies with
// memcpy.
void LandingCopy(std::byte* dst, const std::byte* src, size_t n, LandingStores stores);

// Copies `rows` rows of `length` bytes each, row r from `src + r * src_stride` to
// `dst + r * dst_stride`, each row as LandingCopy stores it: a head-sliced page's rows in one
// call (no call per row), from a peer's strided write or a packed message. Rows must not overlap
// each other or the source (strides of at least `length`).
void LandingCopyRows(std::byte* dst, size_t dst_stride, const std::byte* src, size_t src_stride,
                     size_t length, size_t rows, LandingStores stores);

// Orders every earlier LandingCopy and LandingCopyRows of this thread before its later stores and
// messages (sfence on x86; a release fence elsewhere, where LandingCopy is a memcpy).
void LandingFence();

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_
