#include "engine/memory/cuda_arena.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"
#include "engine/memory/cuda_call.h"

#ifndef KVRAIL_HAVE_CUDA
#error "KVRAIL_HAVE_CUDA must come from @cuda//:config"
#endif

#if KVRAIL_HAVE_CUDA
#include <cuda.h>  // driver API types only: nothing links libcuda
#include <cuda_runtime_api.h>

#include "engine/memory/pattern_fill.h"
#endif

namespace kvrail {

RegionRecord RecordOf(const CudaArena& arena) {
  return RegionRecord{reinterpret_cast<uintptr_t>(arena.data()), arena.size(), arena.kind(),
                      arena.name()};
}

CudaArena::CudaArena(uint8_t* data, size_t size, int device, bool imported, size_t offset)
    : data_(data),
      offset_(offset),
      size_(size),
      device_(device),
      imported_(imported),
      name_(absl::StrCat(imported ? "cuda-ipc:" : "cuda:", device)) {}

CudaArena::CudaArena(CudaArena&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      offset_(std::exchange(other.offset_, 0)),
      size_(std::exchange(other.size_, 0)),
      device_(std::exchange(other.device_, -1)),
      imported_(std::exchange(other.imported_, false)),
      name_(std::move(other.name_)) {
  other.name_.clear();
}

CudaArena& CudaArena::operator=(CudaArena&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    offset_ = std::exchange(other.offset_, 0);
    size_ = std::exchange(other.size_, 0);
    device_ = std::exchange(other.device_, -1);
    imported_ = std::exchange(other.imported_, false);
    name_ = std::move(other.name_);
    other.name_.clear();
  }
  return *this;
}

CudaArena::~CudaArena() { Reset(); }

#if KVRAIL_HAVE_CUDA

namespace {

using cuda_call::CudaError;
using cuda_call::Describe;
using cuda_call::OnDevice;

absl::StatusOr<int> DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU: cudaGetDeviceCount returned ", Describe(error)));
  }
  if (count <= 0) {
    return absl::FailedPreconditionError("no GPU: cudaGetDeviceCount found 0 devices");
  }
  return count;
}

// Checks `device` against the visible devices; errors are prefixed with `subject`.
absl::Status CheckDevice(absl::string_view subject, int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": device ", device, " is not a device index"));
  }
  absl::StatusOr<int> count = DeviceCount();
  if (!count.ok()) return AddContext(count.status(), subject);
  if (device >= *count) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": device ", device,
                                                   " is not visible: the runtime sees ", *count,
                                                   " device(s) (CUDA_VISIBLE_DEVICES applies)"));
  }
  return absl::OkStatus();
}

// The bytes from `pointer` to the end of the driver allocation that holds it, from the driver's
// cuMemGetAddressRange (reached through the runtime, so nothing links libcuda).
absl::StatusOr<size_t> BytesToAllocationEnd(const void* pointer, absl::string_view subject) {
  using GetAddressRange = CUresult (*)(CUdeviceptr * base, size_t * size, CUdeviceptr pointer);
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function,
                                                             12000, cudaEnableDefault, &found);
  if (error != cudaSuccess) {
    return CudaError(subject, "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)", error);
  }
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    return absl::InternalError(
        absl::StrCat(subject, ": the driver has no cuMemGetAddressRange (query result ",
                     static_cast<int>(found), "), so the imported size cannot be checked"));
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr address = reinterpret_cast<uintptr_t>(pointer);
  const CUresult result = reinterpret_cast<GetAddressRange>(function)(&base, &size, address);
  if (result != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat(subject, ": cuMemGetAddressRange failed: CUresult ",
                                            static_cast<int>(result)));
  }
  return static_cast<size_t>(base + size - address);
}

absl::Status CheckRange(const CudaArena& arena, size_t offset, size_t bytes,
                        absl::string_view what) {
  if (offset > arena.size() || bytes > arena.size() - offset) {
    return absl::OutOfRangeError(
        absl::StrCat(arena.name(), ": ", what, " of ", bytes, " bytes at offset ", offset,
                     " does not fit in the arena's ", arena.size(), " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaAvailable() { return DeviceCount().status(); }

absl::StatusOr<CudaArena> CudaArena::Allocate(size_t bytes, int device) {
  const std::string subject = absl::StrCat("CUDA arena on device ", device);
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": size 0: an arena holds at least one byte"));
  }
  KVRAIL_RETURN_IF_ERROR(CheckDevice(subject, device));
  void* data = nullptr;
  KVRAIL_RETURN_IF_ERROR(OnDevice(device, subject, [&]() -> absl::Status {
    const cudaError_t error = cudaMalloc(&data, bytes);
    if (error != cudaSuccess) {
      return CudaError(subject, absl::StrCat("cudaMalloc(", bytes, " bytes)"), error);
    }
    return absl::OkStatus();
  }));
  return CudaArena(static_cast<uint8_t*>(data), bytes, device, /*imported=*/false);
}

absl::StatusOr<CudaArena> ImportCudaIpc(const std::string& ipc_handle_bytes, size_t bytes,
                                        int device, size_t offset) {
  const std::string subject = absl::StrCat("CUDA IPC import on device ", device);
  if (ipc_handle_bytes.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": the handle is ", ipc_handle_bytes.size(),
                     " bytes; a cudaIpcMemHandle_t is exactly ", kCudaIpcHandleBytes));
  }
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": size 0: an arena holds at least one byte"));
  }
  if (offset > SIZE_MAX - bytes) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": offset ", offset, " + ", bytes,
                                                   " bytes do not fit in the address space"));
  }
  KVRAIL_RETURN_IF_ERROR(CheckDevice(subject, device));
  static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes, "CUDA_IPC_HANDLE_SIZE");
  cudaIpcMemHandle_t handle;
  memcpy(&handle, ipc_handle_bytes.data(), sizeof(handle));

  void* data = nullptr;
  KVRAIL_RETURN_IF_ERROR(OnDevice(device, subject, [&]() -> absl::Status {
    cudaError_t error = cudaIpcOpenMemHandle(&data, handle, cudaIpcMemLazyEnablePeerAccess);
    if (error != cudaSuccess) return CudaError(subject, "cudaIpcOpenMemHandle", error);
    absl::StatusOr<size_t> available = BytesToAllocationEnd(data, subject);
    absl::Status status = available.status();
    // The allocation must be the named device's: a handle from another GPU would be mapped over
    // peer access, and every copy would cross the interconnect.
    cudaPointerAttributes attributes = {};
    if (status.ok()) {
      const cudaError_t asked = cudaPointerGetAttributes(&attributes, data);
      if (asked != cudaSuccess) {
        status = CudaError(subject, "cudaPointerGetAttributes", asked);
      } else if (attributes.device != device) {
        status = absl::InvalidArgumentError(
            absl::StrCat(subject, ": the exported allocation lives on device ", attributes.device,
                         ", not on device ", device, " (AttachArena.cuda_device)"));
      }
    }
    if (status.ok() && offset + bytes > *available) {
      status = absl::InvalidArgumentError(
          absl::StrCat(subject, ": offset ", offset, " + the announced size of ", bytes,
                       " bytes exceeds the exported allocation's ", *available, " bytes"));
    }
    if (!status.ok()) cudaIpcCloseMemHandle(data);
    return status;
  }));
  return CudaArena(static_cast<uint8_t*>(data) + offset, bytes, device, /*imported=*/true, offset);
}

absl::StatusOr<std::string> CudaArena::ExportIpcHandle() const {
  if (imported_) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": an imported allocation cannot be exported again (CUDA IPC)"));
  }
  cudaIpcMemHandle_t handle;
  KVRAIL_RETURN_IF_ERROR(OnDevice(device_, name_, [&]() -> absl::Status {
    const cudaError_t error = cudaIpcGetMemHandle(&handle, data_);
    if (error != cudaSuccess) return CudaError(name_, "cudaIpcGetMemHandle", error);
    return absl::OkStatus();
  }));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

absl::Status CudaArena::FillPattern(uint64_t seed) {
  return OnDevice(device_, name_, [&]() -> absl::Status {
    const int error = LaunchPatternFill(data_, size_, seed, 0);
    if (error != 0) {
      return CudaError(name_, "the pattern kernel", static_cast<cudaError_t>(error));
    }
    return absl::OkStatus();
  });
}

absl::Status CudaArena::CopyToHost(size_t offset, absl::Span<uint8_t> out) const {
  KVRAIL_RETURN_IF_ERROR(CheckRange(*this, offset, out.size(), "copy to host"));
  if (out.empty()) return absl::OkStatus();
  return OnDevice(device_, name_, [&]() -> absl::Status {
    const cudaError_t error =
        cudaMemcpy(out.data(), data_ + offset, out.size(), cudaMemcpyDeviceToHost);
    if (error != cudaSuccess) return CudaError(name_, "cudaMemcpy (device to host)", error);
    return absl::OkStatus();
  });
}

absl::Status CudaArena::CopyFromHost(size_t offset, absl::Span<const uint8_t> in) {
  KVRAIL_RETURN_IF_ERROR(CheckRange(*this, offset, in.size(), "copy from host"));
  if (in.empty()) return absl::OkStatus();
  return OnDevice(device_, name_, [&]() -> absl::Status {
    const cudaError_t error =
        cudaMemcpy(data_ + offset, in.data(), in.size(), cudaMemcpyHostToDevice);
    if (error != cudaSuccess) return CudaError(name_, "cudaMemcpy (host to device)", error);
    return absl::OkStatus();
  });
}

void CudaArena::Reset() {
  if (data_ != nullptr) {
    // Errors are ignored: nothing useful can be done about them in a destructor.
    OnDevice(device_, name_, [&]() -> absl::Status {
      if (imported_) {
        cudaIpcCloseMemHandle(data_ - offset_);
      } else {
        cudaFree(data_);
      }
      return absl::OkStatus();
    }).IgnoreError();
  }
  data_ = nullptr;
  size_ = 0;
}

#else  // !KVRAIL_HAVE_CUDA: every entry point says so.

using cuda_call::BuiltWithoutCuda;

absl::Status CudaAvailable() { return BuiltWithoutCuda(""); }

absl::StatusOr<CudaArena> CudaArena::Allocate(size_t bytes, int device) {
  return BuiltWithoutCuda(absl::StrCat("CUDA arena on device ", device, ": "));
}

absl::StatusOr<CudaArena> ImportCudaIpc(const std::string& ipc_handle_bytes, size_t bytes,
                                        int device, size_t offset) {
  return BuiltWithoutCuda(absl::StrCat("CUDA IPC import on device ", device, ": "));
}

absl::StatusOr<std::string> CudaArena::ExportIpcHandle() const { return BuiltWithoutCuda(""); }

absl::Status CudaArena::FillPattern(uint64_t seed) { return BuiltWithoutCuda(""); }

absl::Status CudaArena::CopyToHost(size_t offset, absl::Span<uint8_t> out) const {
  return BuiltWithoutCuda("");
}

absl::Status CudaArena::CopyFromHost(size_t offset, absl::Span<const uint8_t> in) {
  return BuiltWithoutCuda("");
}

// No CudaArena can exist without CUDA, so there is never anything to release.
void CudaArena::Reset() {
  data_ = nullptr;
  size_ = 0;
}

#endif  // KVRAIL_HAVE_CUDA

}  // namespace kvrail
