#include "control/layout/dtype.h"

#include <array>

namespace kvrail::layout {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  int size;
};

constexpr std::array<DTypeInfo, 11> kDTypes = {{
    {DType::kUint8, "uint8", 1},
    {DType::kInt8, "int8", 1},
    {DType::kFloat8E4m3fn, "float8_e4m3fn", 1},
    {DType::kFloat8E5m2, "float8_e5m2", 1},
    {DType::kFloat8E8m0fnu, "float8_e8m0fnu", 1},
    {DType::kBfloat16, "bfloat16", 2},
    {DType::kFloat16, "float16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kFloat32, "float32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kFloat64, "float64", 8},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

int DTypeSize(DType dtype) { return Info(dtype).size; }

std::optional<DType> DTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace kvrail::layout
