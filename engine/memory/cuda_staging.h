// GPU <-> host staging through pinned host memory, for transports that cannot reach GPU memory
// (UCX 1.13 here, and any transport without GPUDirect): the send side copies a device range out
// to host chunks that the transport sends, the receive side scatters received host bytes back
// onto the GPU before a room completes.
//
// Built with or without a CUDA toolkit (third_party/cuda/cuda.bzl), as cuda_arena.h is. Without
// one, every entry point returns Unimplemented("built without CUDA ..."). With one but no usable
// GPU, Create returns CudaAvailable()'s FailedPrecondition("no GPU: ...").
#ifndef KVRAIL_ENGINE_MEMORY_CUDA_STAGING_H_
#define KVRAIL_ENGINE_MEMORY_CUDA_STAGING_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

// The CUDA runtime's opaque handle types (cudaStream_t is CUstream_st*, cudaEvent_t is
// CUevent_st*), declared here so that this header does not need the toolkit's headers.
struct CUstream_st;
struct CUevent_st;

namespace kvrail {

struct StagingOptions {
  // The GPU whose memory is staged; it is made current for the duration of every call.
  int device = 0;
  // The bytes of one pinned chunk: one cudaMemcpyAsync and one sink call each.
  uint64_t chunk_bytes = 4 << 20;
  // Chunks in flight at most, and so pinned chunks held.
  int depth = 4;
};

// A pipeline of `depth` pinned host chunks and a CUDA stream of its own on one GPU.
//
// Calls are serialised (a mutex): the chunks and the stream are shared by every call, so two
// threads that stage through one object take turns. Use one object per thread for parallelism.
class CudaStaging {
 public:
  // Allocates depth x chunk_bytes of pinned host memory (cudaHostAlloc) and a non-blocking
  // stream (cudaStreamCreateWithFlags) on `options.device`.
  //
  // Fails with InvalidArgument when chunk_bytes is 0, depth is below 1, their product overflows,
  // or device is not a visible device index; with CudaAvailable()'s error, unchanged, when there
  // is no GPU; otherwise with the failing CUDA call, its error code and text.
  static absl::StatusOr<std::unique_ptr<CudaStaging>> Create(const StagingOptions& options);

  CudaStaging(const CudaStaging&) = delete;
  CudaStaging& operator=(const CudaStaging&) = delete;
  // Waits for the stream, then releases the events, the stream and the pinned memory.
  ~CudaStaging();

  // The receiver of StageOut's chunks: `host` holds `length` bytes copied from device_src +
  // `offset`. The bytes stay valid only until the sink returns; a non-OK status stops StageOut.
  using Sink =
      absl::FunctionRef<absl::Status(const uint8_t* host, uint64_t offset, uint64_t length)>;

  // Copies the device bytes [device_src, device_src + length) to host in chunks of chunk_bytes
  // and hands each chunk to `sink`, in order of offset. The sink must not call into this object
  // (it runs under the object's mutex). Copies are pipelined: up to `depth`
  // chunks are issued (cudaMemcpyAsync device to host + an event each) before the first sink
  // call, and a chunk's buffer is refilled with the chunk `depth` places later only after its
  // sink call returned, so the sink of one chunk runs while later chunks copy.
  //
  // Fails with InvalidArgument for a null `device_src` or a zero `length`, or when `device_src`
  // is not device memory; with the sink's error (context added: the chunk's offset) when the
  // sink fails, after which the sink is not called again; otherwise with the failing CUDA call.
  // Returns only once no copy into the pinned chunks is outstanding, failure or not.
  absl::Status StageOut(const void* device_src, uint64_t length, Sink sink);

  // The receiver of StageOutRows's chunks: `count` rows of the row length, back to back at
  // `host`, which were rows `first` .. `first` + count - 1 on the device. Valid, and called, as
  // Sink's chunks are.
  using RowSink =
      absl::FunctionRef<absl::Status(const uint8_t* host, uint64_t first, uint64_t count)>;

  // StageOut for `rows` rows of `length` bytes, row r at device_src + r * `pitch`: each chunk
  // holds as many whole rows as fit, packed back to back, copied with one cudaMemcpy2DAsync
  // (device to host), so that a head-sliced page's rows cross the bus without the other ranks'
  // bytes between them, in one copy per chunk rather than one per row. Pipelined as StageOut.
  //
  // Fails with InvalidArgument for a null `device_src`, zero `length` or `rows`, a `pitch` below
  // `length`, a row longer than a chunk (stage such rows one StageOut each), a span that wraps
  // the address space, or `device_src` not device memory; otherwise as StageOut.
  absl::Status StageOutRows(const void* device_src, uint64_t length, uint64_t rows, uint64_t pitch,
                            RowSink sink);

  // One piece of the receive side: `length` host bytes at `host` that belong at `device`; with
  // `rows` > 1, that many rows of `length` bytes, row r from host + r * `host_pitch` to
  // device + r * `device_pitch` (each pitch at least `length`).
  struct Scatter {
    const uint8_t* host;
    void* device;
    uint64_t length;
    uint64_t rows = 1;
    uint64_t host_pitch = 0;
    uint64_t device_pitch = 0;
  };

  // Copies every scatter's host bytes to its device address through the pinned chunks (memcpy
  // into a chunk, then cudaMemcpyAsync host to device), packing small scatters into one chunk,
  // and waits for the stream: when it returns OK, every byte is on the device. A scatter of
  // rows has as many whole rows as fit packed into a chunk and copied on with one
  // cudaMemcpy2DAsync to their pitch on the device; a row longer than a chunk goes as a plain
  // scatter of its own.
  //
  // Fails with InvalidArgument, before copying anything, when a scatter's host or device pointer
  // is null, its length or rows 0, or a pitch of a scatter of rows below its length (the message
  // names scatters[i] and the field); otherwise with the failing CUDA call, in which case some
  // of the bytes may already be on the device.
  absl::Status ScatterIn(absl::Span<const Scatter> scatters);

  // The bytes of pinned host memory held: depth x chunk_bytes.
  uint64_t pinned_bytes() const { return chunk_bytes_ * static_cast<uint64_t>(depth_); }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  int depth() const { return depth_; }
  int device() const { return device_; }

 private:
  CudaStaging(int device, uint64_t chunk_bytes, int depth);

  // StageOut's and StageOutRows's pipeline, under the mutex on the device: chunks 0 ..
  // `chunks` - 1, chunk i into slot i % depth; `issue(i, slot)` issues its copy into the slot
  // (the event is recorded here), `drain(i, slot)` hands the landed chunk on. Up to `depth`
  // chunks are in flight; a slot is issued again only after its chunk was drained.
  template <typename Issue, typename Drain>
  absl::Status Pipeline(uint64_t chunks, Issue issue, Drain drain);
  // InvalidArgument (naming `call`) unless `device_src` is device or managed memory.
  absl::Status CheckDeviceSource(const void* device_src, const char* call);

  // The pinned chunk `slot` (0 <= slot < depth).
  uint8_t* chunk(int slot) const { return pinned_ + static_cast<uint64_t>(slot) * chunk_bytes_; }

  const int device_;
  const uint64_t chunk_bytes_;
  const int depth_;
  // "CUDA staging on device <device>": the prefix of every error message.
  const std::string subject_;

  // Held for the whole of StageOut and ScatterIn: they share the chunks, events and stream.
  std::mutex mutex_;
  uint8_t* pinned_ = nullptr;  // depth_ chunks of chunk_bytes_, one cudaHostAlloc
  CUstream_st* stream_ = nullptr;
  // events_[slot] completes when the last copy issued into or out of chunk `slot` has.
  std::unique_ptr<CUevent_st*[]> events_;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_CUDA_STAGING_H_
