// Counting bytes over whole arenas (hundreds of MiB) in tests that run under ASan's -O0 build,
// where a byte-by-byte loop costs seconds per pass: equal 64 KiB chunks are skipped with memcmp
// (libc's, checked once per call by ASan), and only chunks that differ are counted a word at a
// time.
#ifndef KVRAIL_TESTS_SUPPORT_BYTE_COUNT_H_
#define KVRAIL_TESTS_SUPPORT_BYTE_COUNT_H_

#include <cstddef>
#include <cstdint>

namespace kvrail::testing {

// How many of the n bytes at p differ from value.
uint64_t CountBytesNot(const uint8_t* p, size_t n, uint8_t value);

// How many of the n bytes at a differ from those at b.
uint64_t CountBytesDiffering(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_SUPPORT_BYTE_COUNT_H_
