// Rows at a stride (docs/ARCHITECTURE.md, layer 0): what a strided copy (copy_list.h) and a
// strided write (engine/transport/transport.h) both are, measured the one overflow-safe way that
// the scheduler, every backend's bounds check and UCX's rows message all use.
#ifndef KVRAIL_ENGINE_BASE_ROWS_H_
#define KVRAIL_ENGINE_BASE_ROWS_H_

#include <cstdint>

namespace kvrail {

// `rows` rows of `length` bytes, at `stride_a` on one side and `stride_b` on the other.
struct RowsMeasure {
  uint64_t payload = 0;  // rows x length: the bytes they move
  uint64_t span_a = 0;   // from the first row's first byte to the last row's last, side a
  uint64_t span_b = 0;   // and side b
};

// False, leaving `out` unspecified, when they move no byte (a length or a count of 0), when
// they overlap on a side (more than one row at a stride below the length), or when a figure
// passes 2^64. One row is contiguous whatever its strides.
inline bool MeasureRows(uint64_t rows, uint64_t length, uint64_t stride_a, uint64_t stride_b,
                        RowsMeasure* out) {
  if (length == 0 || rows == 0) return false;
  if (rows == 1) {
    *out = {length, length, length};
    return true;
  }
  uint64_t step_a = 0;
  uint64_t step_b = 0;
  return stride_a >= length && stride_b >= length &&
         !__builtin_mul_overflow(rows, length, &out->payload) &&
         !__builtin_mul_overflow(rows - 1, stride_a, &step_a) &&
         !__builtin_mul_overflow(rows - 1, stride_b, &step_b) &&
         !__builtin_add_overflow(step_a, length, &out->span_a) &&
         !__builtin_add_overflow(step_b, length, &out->span_b);
}

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_BASE_ROWS_H_
