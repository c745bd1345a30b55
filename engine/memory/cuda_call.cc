#include "engine/memory/cuda_call.h"

namespace kvrail::cuda_call {

#if KVRAIL_HAVE_CUDA

namespace {

absl::StatusCode CodeOf(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

std::string Describe(cudaError_t error) {
  return absl::StrCat(static_cast<int>(error), " (", cudaGetErrorName(error), ": ",
                      cudaGetErrorString(error), ")");
}

absl::Status CudaError(absl::string_view subject, absl::string_view call, cudaError_t error) {
  cudaGetLastError();
  return absl::Status(CodeOf(error),
                      absl::StrCat(subject, ": ", call, " failed: ", Describe(error)));
}

#else  // !KVRAIL_HAVE_CUDA

absl::Status BuiltWithoutCuda(absl::string_view prefix) {
  return absl::UnimplementedError(
      absl::StrCat(prefix,
                   "built without CUDA (no toolkit when @cuda was configured; see "
                   "third_party/cuda/cuda.bzl)"));
}

#endif  // KVRAIL_HAVE_CUDA

}  // namespace kvrail::cuda_call
