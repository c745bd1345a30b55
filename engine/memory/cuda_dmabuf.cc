#include "engine/memory/cuda_dmabuf.h"

#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "engine/memory/cuda_arena.h"
#include "engine/memory/cuda_call.h"

#if KVRAIL_HAVE_CUDA
#include <cuda.h>
#endif

namespace kvrail {

bool NvidiaPeermemLoaded(const std::string& sysfs_module) {
  struct stat st = {};
  return stat(absl::StrCat(sysfs_module, "/nvidia_peermem").c_str(), &st) == 0;
}

#if KVRAIL_HAVE_CUDA

namespace {

// A driver function through the runtime (cuda_arena.cc does the same for cuMemGetAddressRange).
absl::StatusOr<void*> DriverEntry(const char* name, absl::string_view subject) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess) {
    return cuda_call::CudaError(
        subject, absl::StrCat("cudaGetDriverEntryPointByVersion(", name, ")"), error);
  }
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(subject, ": the CUDA driver has no ", name,
                                                      " (query result ", static_cast<int>(found),
                                                      "): dmabuf export needs CUDA 11.7 or later"));
  }
  return function;
}

}  // namespace

absl::Status CudaDmabufSupported(int device) {
  const std::string subject = absl::StrCat("dmabuf export on GPU ", device);
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  using GetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  auto function = DriverEntry("cuDeviceGetAttribute", subject);
  if (!function.ok()) return function.status();
  int supported = 0;
  const CUresult result = reinterpret_cast<GetAttribute>(*function)(
      &supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, device);
  if (result != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat(
        subject, ": cuDeviceGetAttribute(DMA_BUF_SUPPORTED) failed: CUresult ", result));
  }
  if (supported == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(subject,
                     ": this GPU or driver does not offer dmabuf export (register GPU memory "
                     "through nvidia-peermem instead, or stage through host memory)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CudaDmabuf> ExportCudaDmabuf(const void* address, uint64_t length) {
  const std::string subject = "dmabuf export";
  if (address == nullptr || length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": needs a device address and a length > 0"));
  }
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  using GetHandle =
      CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  auto function = DriverEntry("cuMemGetHandleForAddressRange", subject);
  if (!function.ok()) return function.status();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uintptr_t>(address) / page * page;
  const uint64_t end = (reinterpret_cast<uintptr_t>(address) + length + page - 1) / page * page;
  int fd = -1;
  const CUresult result = reinterpret_cast<GetHandle>(*function)(
      &fd, static_cast<CUdeviceptr>(begin), static_cast<size_t>(end - begin),
      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (result != CUDA_SUCCESS || fd < 0) {
    return absl::InternalError(absl::StrCat(
        subject, " of ", length, " bytes at 0x", absl::Hex(reinterpret_cast<uintptr_t>(address)),
        ": cuMemGetHandleForAddressRange failed: CUresult ", result));
  }
  return CudaDmabuf{fd, reinterpret_cast<uintptr_t>(address) - begin};
}

#else  // !KVRAIL_HAVE_CUDA

absl::Status CudaDmabufSupported(int device) {
  return cuda_call::BuiltWithoutCuda(absl::StrCat("dmabuf export on GPU ", device, ": "));
}

absl::StatusOr<CudaDmabuf> ExportCudaDmabuf(const void*, uint64_t) {
  return cuda_call::BuiltWithoutCuda("dmabuf export: ");
}

#endif  // KVRAIL_HAVE_CUDA

}  // namespace kvrail
