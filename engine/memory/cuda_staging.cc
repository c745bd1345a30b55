// CudaStaging: GPU <-> host staging through pinned chunks on a stream of its own
// (cuda_staging.h). Without a CUDA toolkit every entry point returns Unimplemented.
#include "engine/memory/cuda_staging.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/base/error.h"
#include "engine/memory/cuda_arena.h"
#include "engine/memory/cuda_call.h"  // checks KVRAIL_HAVE_CUDA; with it, <cuda_runtime_api.h>

namespace kvrail {

CudaStaging::CudaStaging(int device, uint64_t chunk_bytes, int depth)
    : device_(device),
      chunk_bytes_(chunk_bytes),
      depth_(depth),
      subject_(absl::StrCat("CUDA staging on device ", device)) {}

#if KVRAIL_HAVE_CUDA

using cuda_call::CudaError;
using cuda_call::OnDevice;

absl::StatusOr<std::unique_ptr<CudaStaging>> CudaStaging::Create(const StagingOptions& options) {
  const std::string subject = absl::StrCat("CUDA staging on device ", options.device);
  if (options.chunk_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": chunk_bytes 0: a chunk holds at least one byte"));
  }
  if (options.depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": depth ", options.depth, ": at least one chunk must be in flight"));
  }
  if (options.chunk_bytes > SIZE_MAX / static_cast<uint64_t>(options.depth)) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": ", options.depth, " chunks of ",
                                                   options.chunk_bytes,
                                                   " bytes do not fit in the address space"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject, ": device ", options.device, " is not a device index"));
  }
  // Unchanged, so that every "no GPU" in the logs reads the same, whoever reported it.
  KVRAIL_RETURN_IF_ERROR(CudaAvailable());
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) return CudaError(subject, "cudaGetDeviceCount", counted);
  if (options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(subject, ": device ", options.device,
                                                   " is not visible: the runtime sees ", count,
                                                   " device(s) (CUDA_VISIBLE_DEVICES applies)"));
  }

  // The destructor releases whatever was made, so each failure below just returns.
  std::unique_ptr<CudaStaging> staging(
      new CudaStaging(options.device, options.chunk_bytes, options.depth));
  staging->events_ = std::make_unique<CUevent_st*[]>(options.depth);  // all nullptr
  KVRAIL_RETURN_IF_ERROR(OnDevice(options.device, subject, [&]() -> absl::Status {
    const uint64_t bytes = staging->pinned_bytes();
    void* pinned = nullptr;
    cudaError_t error = cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault);
    if (error != cudaSuccess) {
      return CudaError(subject, absl::StrCat("cudaHostAlloc(", bytes, " bytes)"), error);
    }
    staging->pinned_ = static_cast<uint8_t*>(pinned);
    // Non-blocking: the legacy default stream, which other code in the process may use (the
    // pattern kernel does), must not serialise with the staging copies.
    cudaStream_t stream = nullptr;
    error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (error != cudaSuccess) return CudaError(subject, "cudaStreamCreateWithFlags", error);
    staging->stream_ = stream;
    for (int slot = 0; slot < options.depth; ++slot) {
      // Events only order and signal here; timing them would cost for nothing.
      cudaEvent_t event = nullptr;
      error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (error != cudaSuccess) return CudaError(subject, "cudaEventCreateWithFlags", error);
      staging->events_[slot] = event;
    }
    return absl::OkStatus();
  }));
  return staging;
}

CudaStaging::~CudaStaging() {
  if (pinned_ == nullptr && stream_ == nullptr) return;
  // Errors are ignored: nothing useful can be done about them in a destructor.
  OnDevice(device_, subject_, [&]() -> absl::Status {
    // No copy may still be writing a chunk, or reading one, when it is freed.
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (int slot = 0; slot < depth_; ++slot) {
      if (events_[slot] != nullptr) cudaEventDestroy(events_[slot]);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    return absl::OkStatus();
  }).IgnoreError();
}

absl::Status CudaStaging::CheckDeviceSource(const void* device_src, const char* call) {
  // A host pointer here is a caller's mistake that a device-to-host copy would not reliably
  // report: say so before copying anything.
  cudaPointerAttributes attributes;
  const cudaError_t error = cudaPointerGetAttributes(&attributes, device_src);
  if (error != cudaSuccess) {
    return CudaError(subject_, absl::StrCat("cudaPointerGetAttributes (", call, "'s device_src)"),
                     error);
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject_, ": ", call,
                     ": device_src is not device memory (cudaPointerGetAttributes reports memory "
                     "type ",
                     static_cast<int>(attributes.type), ")"));
  }
  return absl::OkStatus();
}

template <typename Issue, typename Drain>
absl::Status CudaStaging::Pipeline(uint64_t chunks, Issue issue, Drain drain) {
  const uint64_t depth = static_cast<uint64_t>(depth_);
  // Chunk `index` goes to chunk slot index % depth, so chunk index + depth reuses the slot of
  // chunk `index`: it is issued only after that chunk was drained.
  const auto issue_one = [&](uint64_t index) -> absl::Status {
    const int slot = static_cast<int>(index % depth);
    KVRAIL_RETURN_IF_ERROR(issue(index, slot));
    const cudaError_t recorded = cudaEventRecord(events_[slot], stream_);
    if (recorded != cudaSuccess) return CudaError(subject_, "cudaEventRecord", recorded);
    return absl::OkStatus();
  };
  absl::Status status;
  uint64_t issued = 0;
  while (status.ok() && issued < chunks && issued < depth) status = issue_one(issued++);
  for (uint64_t next = 0; status.ok() && next < chunks; ++next) {
    const int slot = static_cast<int>(next % depth);
    const cudaError_t error = cudaEventSynchronize(events_[slot]);
    if (error != cudaSuccess) {
      status = CudaError(subject_, absl::StrCat("cudaEventSynchronize (chunk ", next, ")"), error);
      break;
    }
    status = drain(next, slot);
    if (!status.ok()) break;
    if (issued < chunks) status = issue_one(issued++);
  }
  // On failure, copies issued ahead may still be writing chunks: they must be done before the
  // next call reuses the chunks (or the destructor frees them).
  if (!status.ok()) cudaStreamSynchronize(stream_);
  return status;
}

absl::Status CudaStaging::StageOut(const void* device_src, uint64_t length, Sink sink) {
  if (device_src == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(subject_, ": StageOut: device_src is null"));
  }
  if (length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(subject_, ": StageOut: length is 0: nothing to stage"));
  }
  if (reinterpret_cast<uintptr_t>(device_src) > UINTPTR_MAX - length) {
    return absl::InvalidArgumentError(absl::StrCat(subject_, ": StageOut: device_src + length (",
                                                   length, ") wraps around the address space"));
  }
  const uint8_t* const src = static_cast<const uint8_t*>(device_src);
  const uint64_t chunks = length / chunk_bytes_ + (length % chunk_bytes_ != 0 ? 1 : 0);

  std::lock_guard<std::mutex> lock(mutex_);
  return OnDevice(device_, subject_, [&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(CheckDeviceSource(device_src, "StageOut"));
    return Pipeline(
        chunks,
        [&](uint64_t index, int slot) -> absl::Status {
          const uint64_t offset = index * chunk_bytes_;
          const uint64_t bytes = std::min(chunk_bytes_, length - offset);
          const cudaError_t copied =
              cudaMemcpyAsync(chunk(slot), src + offset, bytes, cudaMemcpyDeviceToHost, stream_);
          if (copied == cudaSuccess) return absl::OkStatus();
          return CudaError(subject_,
                           absl::StrCat("cudaMemcpyAsync (device to host, ", bytes,
                                        " bytes at offset ", offset, ")"),
                           copied);
        },
        [&](uint64_t index, int slot) -> absl::Status {
          const uint64_t offset = index * chunk_bytes_;
          const uint64_t bytes = std::min(chunk_bytes_, length - offset);
          const absl::Status sunk = sink(chunk(slot), offset, bytes);
          if (sunk.ok()) return sunk;
          return AddContext(sunk, absl::StrCat(subject_, ": StageOut: the sink of the ", bytes,
                                               " bytes at offset ", offset));
        });
  });
}

absl::Status CudaStaging::StageOutRows(const void* device_src, uint64_t length, uint64_t rows,
                                       uint64_t pitch, RowSink sink) {
  const char* refused = device_src == nullptr ? "device_src is null"
                        : length == 0         ? "length is 0: nothing to stage"
                        : rows == 0           ? "rows is 0: nothing to stage"
                        : pitch < length      ? "pitch is below length: rows would overlap"
                        : length > chunk_bytes_
                            ? "a row is longer than a chunk: stage such rows with StageOut"
                            : nullptr;
  if (refused != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(subject_, ": StageOutRows (", rows, " rows of ",
                                                   length, " bytes, pitch ", pitch,
                                                   "): ", refused));
  }
  if (rows - 1 > (UINTPTR_MAX - length) / pitch ||
      reinterpret_cast<uintptr_t>(device_src) > UINTPTR_MAX - ((rows - 1) * pitch + length)) {
    return absl::InvalidArgumentError(absl::StrCat(subject_, ": StageOutRows: ", rows,
                                                   " rows of pitch ", pitch,
                                                   " wrap around the address space"));
  }
  const uint8_t* const src = static_cast<const uint8_t*>(device_src);
  const uint64_t per_chunk = chunk_bytes_ / length;
  const uint64_t chunks = rows / per_chunk + (rows % per_chunk != 0 ? 1 : 0);
  const auto rows_of = [&](uint64_t index) {
    return std::min(per_chunk, rows - index * per_chunk);
  };

  std::lock_guard<std::mutex> lock(mutex_);
  return OnDevice(device_, subject_, [&]() -> absl::Status {
    KVRAIL_RETURN_IF_ERROR(CheckDeviceSource(device_src, "StageOutRows"));
    return Pipeline(
        chunks,
        [&](uint64_t index, int slot) -> absl::Status {
          const uint64_t first = index * per_chunk;
          const uint64_t count = rows_of(index);
          const cudaError_t copied =
              cudaMemcpy2DAsync(chunk(slot), length, src + first * pitch, pitch, length, count,
                                cudaMemcpyDeviceToHost, stream_);
          if (copied == cudaSuccess) return absl::OkStatus();
          return CudaError(
              subject_,
              absl::StrCat("cudaMemcpy2DAsync (device to host, rows ", first, " to ",
                           first + count - 1, " of ", length, " bytes, pitch ", pitch, ")"),
              copied);
        },
        [&](uint64_t index, int slot) -> absl::Status {
          const uint64_t first = index * per_chunk;
          const absl::Status sunk = sink(chunk(slot), first, rows_of(index));
          if (sunk.ok()) return sunk;
          return AddContext(
              sunk, absl::StrCat(subject_, ": StageOutRows: the sink of rows from ", first));
        });
  });
}

absl::Status CudaStaging::ScatterIn(absl::Span<const Scatter> scatters) {
  for (size_t i = 0; i < scatters.size(); ++i) {
    const Scatter& scatter = scatters[i];
    const char* missing = scatter.host == nullptr     ? "host is null"
                          : scatter.device == nullptr ? "device is null"
                          : scatter.length == 0       ? "length is 0"
                          : scatter.rows == 0         ? "rows is 0"
                          : scatter.rows > 1 && (scatter.host_pitch < scatter.length ||
                                                 scatter.device_pitch < scatter.length)
                              ? "host_pitch or device_pitch is below length: rows would overlap"
                              : nullptr;
    if (missing != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(subject_, ": ScatterIn: scatters[", i, "].", missing));
    }
  }
  if (scatters.empty()) return absl::OkStatus();

  std::lock_guard<std::mutex> lock(mutex_);
  return OnDevice(device_, subject_, [&]() -> absl::Status {
    // Scatters are packed into the current chunk back to back, one cudaMemcpyAsync per piece,
    // so many small scatters (KV blocks) share a chunk rather than waiting on one each. When a
    // chunk is full its event is recorded and the next chunk is taken, after waiting for the
    // copies out of it that an earlier round issued (the previous call left none: it ended with
    // a stream synchronisation).
    std::vector<bool> recorded(static_cast<size_t>(depth_), false);
    int slot = 0;
    uint64_t used = 0;
    // Moves on to the next chunk (the current one's copies recorded), waiting for the copies
    // out of it that an earlier round issued.
    const auto next_chunk = [&]() -> absl::Status {
      cudaError_t error = cudaEventRecord(events_[slot], stream_);
      if (error != cudaSuccess) return CudaError(subject_, "cudaEventRecord", error);
      recorded[slot] = true;
      slot = (slot + 1) % depth_;
      used = 0;
      if (recorded[slot]) {
        error = cudaEventSynchronize(events_[slot]);
        if (error != cudaSuccess) return CudaError(subject_, "cudaEventSynchronize", error);
      }
      return absl::OkStatus();
    };
    // `length` bytes from `host` to `device` through the chunks, one cudaMemcpyAsync a piece.
    const auto plain = [&](size_t i, const uint8_t* host, uint8_t* device,
                           uint64_t length) -> absl::Status {
      uint64_t remaining = length;
      while (remaining > 0) {
        if (used == chunk_bytes_) KVRAIL_RETURN_IF_ERROR(next_chunk());
        const uint64_t bytes = std::min(remaining, chunk_bytes_ - used);
        uint8_t* staged = chunk(slot) + used;
        memcpy(staged, host, bytes);
        const cudaError_t error =
            cudaMemcpyAsync(device, staged, bytes, cudaMemcpyHostToDevice, stream_);
        if (error != cudaSuccess) {
          return CudaError(subject_,
                           absl::StrCat("cudaMemcpyAsync (host to device, scatters[", i, "], ",
                                        bytes, " bytes at offset ", length - remaining, ")"),
                           error);
        }
        used += bytes;
        host += bytes;
        device += bytes;
        remaining -= bytes;
      }
      return absl::OkStatus();
    };
    // A scatter's rows, as many whole rows as fit packed into the chunk and one
    // cudaMemcpy2DAsync to their device pitch.
    const auto rows = [&](size_t i, const Scatter& scatter) -> absl::Status {
      const uint64_t length = scatter.length;
      uint64_t row = 0;
      while (row < scatter.rows) {
        if (chunk_bytes_ - used < length) KVRAIL_RETURN_IF_ERROR(next_chunk());
        const uint64_t count = std::min(scatter.rows - row, (chunk_bytes_ - used) / length);
        uint8_t* staged = chunk(slot) + used;
        for (uint64_t r = 0; r < count; ++r) {
          memcpy(staged + r * length, scatter.host + (row + r) * scatter.host_pitch, length);
        }
        const cudaError_t error = cudaMemcpy2DAsync(
            static_cast<uint8_t*>(scatter.device) + row * scatter.device_pitch,
            scatter.device_pitch, staged, length, length, count, cudaMemcpyHostToDevice, stream_);
        if (error != cudaSuccess) {
          return CudaError(subject_,
                           absl::StrCat("cudaMemcpy2DAsync (host to device, scatters[", i,
                                        "], rows ", row, " to ", row + count - 1, " of ", length,
                                        " bytes, pitch ", scatter.device_pitch, ")"),
                           error);
        }
        used += count * length;
        row += count;
      }
      return absl::OkStatus();
    };
    absl::Status status;
    for (size_t i = 0; status.ok() && i < scatters.size(); ++i) {
      const Scatter& scatter = scatters[i];
      if (scatter.rows > 1 && scatter.length <= chunk_bytes_) {
        status = rows(i, scatter);
        continue;
      }
      for (uint64_t r = 0; status.ok() && r < scatter.rows; ++r) {  // a row longer than a chunk
        status =
            plain(i, scatter.host + r * scatter.host_pitch,
                  static_cast<uint8_t*>(scatter.device) + r * scatter.device_pitch, scatter.length);
      }
    }
    // Every byte on the device, or, after a failure, no copy still reading a chunk.
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    if (status.ok() && synced != cudaSuccess) {
      status = CudaError(subject_, "cudaStreamSynchronize (ScatterIn)", synced);
    }
    return status;
  });
}

#else  // !KVRAIL_HAVE_CUDA: every entry point says so; no object can exist.

using cuda_call::BuiltWithoutCuda;

absl::StatusOr<std::unique_ptr<CudaStaging>> CudaStaging::Create(const StagingOptions& options) {
  return BuiltWithoutCuda(absl::StrCat("CUDA staging on device ", options.device, ": "));
}

CudaStaging::~CudaStaging() = default;

absl::Status CudaStaging::StageOut(const void* device_src, uint64_t length, Sink sink) {
  return BuiltWithoutCuda(absl::StrCat(subject_, ": "));
}

absl::Status CudaStaging::StageOutRows(const void* device_src, uint64_t length, uint64_t rows,
                                       uint64_t pitch, RowSink sink) {
  return BuiltWithoutCuda(absl::StrCat(subject_, ": "));
}

absl::Status CudaStaging::ScatterIn(absl::Span<const Scatter> scatters) {
  return BuiltWithoutCuda(absl::StrCat(subject_, ": "));
}

#endif  // KVRAIL_HAVE_CUDA

}  // namespace kvrail
