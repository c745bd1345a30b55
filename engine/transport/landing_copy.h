// The copy that puts a write's bytes where they land: into a peer's memory (a store through a
// shared-memory mapping of the peer's segment) or, at a target, out of a received message into
// the registered region it names. Nobody on this thread reads those bytes again: the peer's
// engine (or its GPU, or the next hop) does. So the 64-byte lines of the destination that the
// copy covers whole are written with non-temporal stores, which do not read the line first
// (a plain store's read-for-ownership doubles the memory traffic of a 1 KiB row into a page
// that is not in cache: 2-4.6 GB/s against 6.4-8.2 GB/s on this machine, BENCHMARKS.md "Landing
// copies"); the ragged head and tail are copied as usual.
//
// Non-temporal stores are weakly ordered: call LandingFence() after a run of LandingCopy and
// before anything that tells the reader the bytes are there (a flush's answer, a status frame).
//
// Under ThreadSanitizer the copy is a memcpy, which TSan sees (it cannot see these stores), so
// races on landing memory stay visible to the sanitizer builds.
#ifndef KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_
#define KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_

#include <cstddef>

namespace kvrail::transport {

// Copies below this many bytes are plain memcpy: their lines are few and often partial.
inline constexpr size_t kLandingStreamMin = 256;

// Copies `n` bytes from `src` to `dst` (which must not overlap), streaming the whole 64-byte
// lines of `dst` past the cache when `n` >= kLandingStreamMin.
void LandingCopy(std::byte* dst, const std::byte* src, size_t n);

// Orders every earlier LandingCopy of this thread before its later stores and messages
// (sfence on x86; a release fence elsewhere, where LandingCopy is a memcpy).
void LandingFence();

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_LANDING_COPY_H_
