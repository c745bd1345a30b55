#include "engine/transport/landing_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "engine/base/sanitizers.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#if KVRAIL_TSAN || !defined(__x86_64__)
#define KVRAIL_LANDING_PLAIN 1
#endif

namespace kvrail::transport {

const char* LandingStoresName(LandingStores stores) {
  switch (stores) {
    case LandingStores::kAuto:
      return "auto";
    case LandingStores::kPlain:
      return "plain";
    case LandingStores::kStreaming:
      return "streaming";
  }
  return "?";
}

LandingStores LandingStoresFor(LandingStores stores, size_t length, size_t src_stride,
                               size_t dst_stride, size_t rows) {
  if (stores != LandingStores::kAuto) return stores;
  const bool one_range = src_stride == length && dst_stride == length;
  return rows > 1 && !one_range ? LandingStores::kStreaming : LandingStores::kPlain;
}

std::optional<LandingStores> LandingStoresNamed(std::string_view name) {
  for (LandingStores stores : kAllLandingStores) {
    if (name == LandingStoresName(stores)) return stores;
  }
  return std::nullopt;
}

#if defined(KVRAIL_LANDING_PLAIN)

namespace {

void Land(std::byte* dst, const std::byte* src, size_t n, LandingStores /*stores*/) {
  std::memcpy(dst, src, n);
}

}  // namespace

void LandingFence() { std::atomic_thread_fence(std::memory_order_release); }

#else

namespace {

// LandingCopy's streaming kind, for `n` >= kLandingStreamMin.
void StreamCopy(std::byte* dst, const std::byte* src, size_t n) {
  // The head, up to the first 64-byte boundary of the destination.
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(dst) & 63)) & 63;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  // Whole lines: four 16-byte loads (the source may be unaligned), four streaming stores. SSE2
  // is in every x86-64, so no dispatch; on this machine it runs as fast as AVX2 streams here.
  const size_t lines = n / 64;
  for (size_t i = 0; i < lines; ++i) {
    const auto* s = reinterpret_cast<const __m128i*>(src);
    auto* d = reinterpret_cast<__m128i*>(dst);
    const __m128i a = _mm_loadu_si128(s);
    const __m128i b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2);
    const __m128i e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
    src += 64;
    dst += 64;
  }
  std::memcpy(dst, src, n - lines * 64);  // the tail
}

void Land(std::byte* dst, const std::byte* src, size_t n, LandingStores stores) {
  if (stores != LandingStores::kStreaming || n < kLandingStreamMin) {
    std::memcpy(dst, src, n);
    return;
  }
  StreamCopy(dst, src, n);
}

}  // namespace

void LandingFence() {
  std::atomic_thread_fence(std::memory_order_release);  // the compiler's order
  _mm_sfence();                                         // the streaming stores'
}

#endif

// Both builds: each row is Land (above, this build's), inlined, not a call per row.
void LandingCopy(std::byte* dst, const std::byte* src, size_t n, LandingStores stores) {
  Land(dst, src, n, stores);
}

void LandingCopyRows(std::byte* dst, size_t dst_stride, const std::byte* src, size_t src_stride,
                     size_t length, size_t rows, LandingStores stores) {
  if (rows > 1 && src_stride == length && dst_stride == length) {
    // Rows back to back at both ends are one range: one row of it, not a call per row.
    length *= rows;
    src_stride = dst_stride = length;
    rows = 1;
  }
  stores = LandingStoresFor(stores, length, src_stride, dst_stride, rows);
  for (size_t row = 0; row < rows; ++row) {
    Land(dst + row * dst_stride, src + row * src_stride, length, stores);
  }
}

void LandingCopySharedRows(const LandingSlice* slices, size_t count, size_t src_stride, size_t rows,
                           LandingStores stores) {
  // At most a source row's slices: the kinds are decided once, not per row.
  constexpr size_t kMostSlices = 16;
  LandingStores kinds[kMostSlices];
  for (size_t first = 0; first < count; first += kMostSlices) {
    const size_t n = std::min(count - first, kMostSlices);
    const LandingSlice* group = slices + first;
    for (size_t i = 0; i < n; ++i) {
      kinds[i] = LandingStoresFor(stores, group[i].length, src_stride, group[i].dst_stride, rows);
    }
    for (size_t row = 0; row < rows; ++row) {
      for (size_t i = 0; i < n; ++i) {
        Land(group[i].dst + row * group[i].dst_stride, group[i].src + row * src_stride,
             group[i].length, kinds[i]);
      }
    }
  }
}

}  // namespace kvrail::transport
