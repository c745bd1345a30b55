// GPU memory as an arena: allocated here, or imported from another process through CUDA IPC
// (the engine exports its KV cache's cudaIpcMemHandle_t; the sidecar imports it and registers
// the mapping with the data plane for GPUDirect).
//
// Built with or without a CUDA toolkit (third_party/cuda/cuda.bzl). Without one, every factory
// and CudaAvailable() return Unimplemented("built without CUDA ..."). With one but no usable
// GPU, they return FailedPrecondition("no GPU: ...") saying what the runtime reported.
#ifndef KVRAIL_ENGINE_MEMORY_CUDA_ARENA_H_
#define KVRAIL_ENGINE_MEMORY_CUDA_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/memory/region.h"

namespace kvrail {

// sizeof(cudaIpcMemHandle_t) (CUDA_IPC_HANDLE_SIZE): the bytes ImportCudaIpc takes.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// OK when this build has CUDA and the runtime sees at least one device. Otherwise one line:
//   Unimplemented       "built without CUDA (no toolkit when @cuda was configured; ...)"
//   FailedPrecondition  "no GPU: cudaGetDeviceCount returned 35 (cudaErrorInsufficientDriver:
//                        CUDA driver version is insufficient for CUDA runtime version)"
//   FailedPrecondition  "no GPU: cudaGetDeviceCount found 0 devices"
absl::Status CudaAvailable();

// A range of device memory on one GPU, owned by this object.
//
// Move-only. The destructor frees an allocation (cudaFree) or closes an import
// (cudaIpcCloseMemHandle). Methods that touch the device make `device()` current for their
// duration and restore the caller's current device afterwards.
class CudaArena {
 public:
  // Allocates `bytes` of device memory on `device` (cudaMalloc). Contents are undefined.
  //
  // Fails with InvalidArgument when `bytes` is 0 or `device` is not a visible device index;
  // with CudaAvailable()'s error when there is no GPU; otherwise the failing CUDA call, its
  // error code and text (ResourceExhausted when the device is out of memory).
  static absl::StatusOr<CudaArena> Allocate(size_t bytes, int device);

  CudaArena(CudaArena&& other) noexcept;
  CudaArena& operator=(CudaArena&& other) noexcept;
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;
  ~CudaArena();

  // The 64-byte cudaIpcMemHandle_t for this allocation, for ImportCudaIpc in another process.
  // Fails with FailedPrecondition for an imported arena (CUDA cannot re-export an import),
  // otherwise with the failing CUDA call.
  absl::StatusOr<std::string> ExportIpcHandle() const;

  // Fills the whole arena with PatternByte(seed, offset) on the device (a kernel), and waits.
  absl::Status FillPattern(uint64_t seed);

  // Copy the arena's bytes [offset, offset + out.size()) to `out`, or `in` to the arena's bytes
  // [offset, offset + in.size()), and wait. Fail with OutOfRange when that range does not lie
  // within the arena; otherwise with the failing CUDA call.
  absl::Status CopyToHost(size_t offset, absl::Span<uint8_t> out) const;
  absl::Status CopyFromHost(size_t offset, absl::Span<const uint8_t> in);

  // The device address of the first byte; nullptr only for a moved-from arena.
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  // Always MemoryKind::kCuda.
  MemoryKind kind() const { return MemoryKind::kCuda; }
  // "cuda:<device>" for an allocation, "cuda-ipc:<device>" for an import.
  const std::string& name() const { return name_; }
  bool imported() const { return imported_; }

 private:
  friend absl::StatusOr<CudaArena> ImportCudaIpc(const std::string& ipc_handle_bytes, size_t bytes,
                                                 int device, size_t offset);
  CudaArena(uint8_t* data, size_t size, int device, bool imported, size_t offset = 0);
  void Reset();

  uint8_t* data_ = nullptr;
  size_t offset_ =
      0;  // of data_ into the mapping (an import at an offset): freed at data_ - offset_
  size_t size_ = 0;
  int device_ = -1;
  bool imported_ = false;
  std::string name_;
};

// Maps, on `device`, the allocation that another process exported with ExportIpcHandle
// (cudaIpcOpenMemHandle, peer access enabled lazily). The arena starts `offset` bytes into the
// allocation (a framework's caching allocator may place the KV tensor inside a larger block) and
// covers `bytes` bytes, which the exporter announced.
//
// Requires a different process from the exporter: CUDA refuses to import a handle into the
// process that made it. Fails with InvalidArgument when `ipc_handle_bytes` is not exactly 64
// bytes, `bytes` is 0, `offset` + `bytes` overflows, `device` is not a visible device index, or
// `offset` + `bytes` exceeds the size of the exported allocation (checked with the driver's
// cuMemGetAddressRange: bounds before bytes); with CudaAvailable()'s error when there is no GPU;
// otherwise the failing CUDA call.
absl::StatusOr<CudaArena> ImportCudaIpc(const std::string& ipc_handle_bytes, size_t bytes,
                                        int device, size_t offset = 0);

// The record of `arena`: its device address range, kind kCuda, and name.
RegionRecord RecordOf(const CudaArena& arena);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_CUDA_ARENA_H_
