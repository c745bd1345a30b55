// GPU memory as a dmabuf: the file descriptor an RDMA NIC registers GPU memory through
// (ibv_reg_dmabuf_mr) without nvidia-peermem, from the driver's cuMemGetHandleForAddressRange
// (CUDA 11.7+, on GPUs and drivers that offer it: CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), and
// whether the nvidia-peermem module is loaded for the older way (ibv_reg_mr on a device pointer).
//
// Reached through the CUDA runtime's driver entry points, so nothing links libcuda. Built with or
// without a toolkit, like cuda_arena.h: without one, Unimplemented; with one but no usable GPU,
// CudaAvailable()'s FailedPrecondition ("no GPU: ...").
#ifndef KVRAIL_ENGINE_MEMORY_CUDA_DMABUF_H_
#define KVRAIL_ENGINE_MEMORY_CUDA_DMABUF_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvrail {

// OK when `device` can export its memory as dmabufs (the device attribute says so); otherwise
// the reason in one line (no GPU, a driver without the entry point, a GPU that does not offer
// it).
absl::Status CudaDmabufSupported(int device);

// A dmabuf fd for device memory [address, address + length), owned by the caller (close it once
// the registration that uses it is gone: the NIC keeps its own reference), and the offset of
// `address` in it: the driver exports whole pages, so the range is widened to the host page
// size around it. InvalidArgument for a null address or zero length; the driver's CUresult
// otherwise.
struct CudaDmabuf {
  int fd = -1;
  uint64_t offset = 0;  // of `address` within the dmabuf
};
absl::StatusOr<CudaDmabuf> ExportCudaDmabuf(const void* address, uint64_t length);

// Whether the nvidia-peermem kernel module is loaded (`sysfs_module`/nvidia_peermem exists),
// which lets ibv_reg_mr register device pointers directly.
bool NvidiaPeermemLoaded(const std::string& sysfs_module = "/sys/module");

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_CUDA_DMABUF_H_
