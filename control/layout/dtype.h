// The element types a contract field may use (CACHEPD §4.7). Only the byte size matters: the
// transfer copies bytes.
#ifndef KVRAIL_CONTROL_LAYOUT_DTYPE_H_
#define KVRAIL_CONTROL_LAYOUT_DTYPE_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace kvrail::layout {

enum class DType {
  kUint8,
  kInt8,
  kFloat8E4m3fn,
  kFloat8E5m2,
  kFloat8E8m0fnu,
  kBfloat16,
  kFloat16,
  kInt32,
  kFloat32,
  kInt64,
  kFloat64,
};

// The wire name, e.g. "bfloat16".
absl::string_view DTypeName(DType dtype);

// The dtype called `name` on the wire, or nullopt when it is not one of the 11 names of §4.7.
std::optional<DType> DTypeFromName(absl::string_view name);

// Bytes per element: 1, 2, 4 or 8.
int DTypeSize(DType dtype);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_DTYPE_H_
