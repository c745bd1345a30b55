// Calls into the CUDA runtime as cuda_arena.cc and cuda_staging.cc make them, so that their
// errors read alike: "<subject>: <call> failed: <code> (<name>: <text>)". Internal to
// engine/memory. Without a CUDA toolkit, only the "built without CUDA" answer.
#ifndef KVRAIL_ENGINE_MEMORY_CUDA_CALL_H_
#define KVRAIL_ENGINE_MEMORY_CUDA_CALL_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#ifndef KVRAIL_HAVE_CUDA
#error "KVRAIL_HAVE_CUDA must come from @cuda//:config"
#endif

#if KVRAIL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvrail::cuda_call {

#if KVRAIL_HAVE_CUDA

// "<code> (<name>: <text>)", as CUDA reports it.
std::string Describe(cudaError_t error);

// "<subject>: <call> failed: <code> (<name>: <text>)", with a status code for the error
// (kResourceExhausted, kInvalidArgument, kFailedPrecondition or kInternal). Clears the runtime's
// last error, so a later call does not report this one again (sticky errors stay, as CUDA
// decides).
absl::Status CudaError(absl::string_view subject, absl::string_view call, cudaError_t error);

// Runs `body` (returning absl::Status) with `device` current, then makes the caller's device
// current again: the caller may be working on another GPU. Errors of the switch are prefixed
// with `subject`.
template <typename Body>
absl::Status OnDevice(int device, absl::string_view subject, Body&& body) {
  int previous = -1;
  cudaError_t error = cudaGetDevice(&previous);
  if (error != cudaSuccess) return CudaError(subject, "cudaGetDevice", error);
  if (previous != device) {
    error = cudaSetDevice(device);
    if (error != cudaSuccess) {
      return CudaError(subject, absl::StrCat("cudaSetDevice(", device, ")"), error);
    }
  }
  absl::Status status = body();
  if (previous != device) cudaSetDevice(previous);
  return status;
}

#else  // !KVRAIL_HAVE_CUDA

// Unimplemented: "<prefix>built without CUDA (no toolkit when @cuda was configured; ...)".
// `prefix` ends with ": " when it is not empty.
absl::Status BuiltWithoutCuda(absl::string_view prefix);

#endif  // KVRAIL_HAVE_CUDA

}  // namespace kvrail::cuda_call

#endif  // KVRAIL_ENGINE_MEMORY_CUDA_CALL_H_
