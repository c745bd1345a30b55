// bench/gpu/gpu_check.cu: what a lent GPU machine offers kvrail, measured with the CUDA runtime
// API alone (bench/gpu/README.md). The engine's own CUDA code (engine/memory/cuda_arena.cc,
// cuda_staging.cc) needs abseil, which such a machine does not have, so this program re-does the
// same operations by hand: CUDA IPC between two processes, pinned and pageable copy bandwidth,
// the staging path that CudaStaging implements, and what a GPUDirect transport would need.
//
// Usage: gpu_check [all|info|ipc|bandwidth|staging|rows|dmabuf]   (bench/gpu/check: each step)
//        gpu_check ipc-import HEX BYTES SEED                  (the IPC step's child; internal)
// Exit status: 0 every check passed; 1 a verification or a CUDA call failed; 2 no GPU (one line
// "no GPU: ..." on stdout); 3 usage.
//
// Only the pattern comes from the repository (engine/memory/pattern_byte.h, which depends on
// nothing), so that bytes checked here are the bytes the engine's tests check.
#include <cuda.h>  // driver API types only: the driver is reached through the runtime
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/memory/pattern_byte.h"

namespace {

using kvrail::PatternByte;

constexpr int kExitFailed = 1;
constexpr int kExitNoGpu = 2;
constexpr int kExitUsage = 3;

constexpr uint64_t kMiB = 1ull << 20;
constexpr double kGB = 1e9;  // bandwidths are decimal GB/s, as NVIDIA and PCIe quote them

// The IPC step: a 256 MiB arena; the child verifies samples of it and writes kIpcWriteBytes at
// kIpcWriteOffset with a second seed, which the parent then finds.
constexpr uint64_t kIpcBytes = 256 * kMiB;
constexpr uint64_t kIpcSeed = 0x1bc5eed;
constexpr uint64_t kIpcWriteSeed = 0x1bc5eee;
constexpr uint64_t kIpcWriteOffset = 100 * kMiB + 4096;
constexpr uint64_t kIpcWriteBytes = 4 * kMiB;
constexpr int kIpcSamples = 256;
constexpr uint64_t kIpcSampleBytes = 4096;

// The staging step: one room of 256 MiB through 4 MiB chunks, 4 in flight (StagingOptions'
// defaults), scattered back in 1 MiB pieces (a stand-in for KV blocks).
constexpr uint64_t kRoomBytes = 256 * kMiB;
constexpr uint64_t kChunkBytes = 4 * kMiB;
constexpr int kDepth = 4;
constexpr uint64_t kScatterBytes = 1 * kMiB;
constexpr int kStagingRuns = 3;

// Reports a failed CUDA call on stderr and exits 1: every later step would fail the same way.
[[noreturn]] void Fail(const char* call, cudaError_t error, int line) {
  fprintf(stderr, "FAIL: %s failed: %d (%s: %s) [gpu_check.cu:%d]\n", call, static_cast<int>(error),
          cudaGetErrorName(error), cudaGetErrorString(error), line);
  exit(kExitFailed);
}

#define CHECK_CUDA(call)                     \
  do {                                       \
    const cudaError_t check_error_ = (call); \
    if (check_error_ != cudaSuccess) {       \
      Fail(#call, check_error_, __LINE__);   \
    }                                        \
  } while (false)

// One row of the table: a name column, then the value. Flushed at once, so that rows keep their
// order when a child process writes to the same stdout.
void Row(const char* name, const char* format, ...) __attribute__((format(printf, 2, 3)));
void Row(const char* name, const char* format, ...) {
  printf("  %-34s ", name);
  va_list args;
  va_start(args, format);
  vprintf(format, args);
  va_end(args);
  printf("\n");
  fflush(stdout);
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Exits 2 with one line saying why, when the runtime sees no GPU.
int RequireGpu() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    printf("no GPU: cudaGetDeviceCount returned %d (%s: %s)\n", static_cast<int>(error),
           cudaGetErrorName(error), cudaGetErrorString(error));
    exit(kExitNoGpu);
  }
  if (count <= 0) {
    printf("no GPU: cudaGetDeviceCount found 0 devices\n");
    exit(kExitNoGpu);
  }
  return count;
}

// ---- Kernels: the pattern on the device, and its check there (256 MiB checked on the host
// would take longer than the copies being measured). ----

__global__ void FillKernel(uint8_t* data, uint64_t bytes, uint64_t seed, uint64_t first_offset) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    data[i] = PatternByte(seed, first_offset + i);
  }
}

__global__ void CompareKernel(const uint8_t* data, uint64_t bytes, uint64_t seed,
                              uint64_t first_offset, unsigned long long* mismatches,
                              unsigned long long* first_mismatch) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    if (data[i] != PatternByte(seed, first_offset + i)) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first_mismatch, static_cast<unsigned long long>(i));
    }
  }
}

constexpr unsigned kThreads = 256;
constexpr unsigned kBlocks = 4096;

// Writes PatternByte(seed, first_offset + i) to data[i], and waits.
void Fill(uint8_t* data, uint64_t bytes, uint64_t seed, uint64_t first_offset = 0) {
  FillKernel<<<kBlocks, kThreads>>>(data, bytes, seed, first_offset);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
}

// The number of bytes of data[0, bytes) that differ from the pattern; *first gets the index of
// the first of them.
uint64_t Mismatches(const uint8_t* data, uint64_t bytes, uint64_t seed, uint64_t first_offset,
                    uint64_t* first) {
  unsigned long long* counters = nullptr;
  CHECK_CUDA(cudaMalloc(&counters, 2 * sizeof(unsigned long long)));
  const unsigned long long initial[2] = {0, ~0ull};
  CHECK_CUDA(cudaMemcpy(counters, initial, sizeof(initial), cudaMemcpyHostToDevice));
  CompareKernel<<<kBlocks, kThreads>>>(data, bytes, seed, first_offset, counters, counters + 1);
  CHECK_CUDA(cudaGetLastError());
  unsigned long long result[2];
  CHECK_CUDA(cudaMemcpy(result, counters, sizeof(result), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(counters));
  *first = result[1];
  return result[0];
}

// True, with a row saying so, when data[0, bytes) holds the pattern; else a FAIL line.
bool Verify(const char* what, const uint8_t* data, uint64_t bytes, uint64_t seed,
            uint64_t first_offset) {
  uint64_t first = 0;
  const uint64_t bad = Mismatches(data, bytes, seed, first_offset, &first);
  if (bad != 0) {
    fprintf(stderr, "FAIL: %s: %llu of %llu bytes differ from the pattern, the first at %llu\n",
            what, static_cast<unsigned long long>(bad), static_cast<unsigned long long>(bytes),
            static_cast<unsigned long long>(first));
    return false;
  }
  return true;
}

// ---- (1) The device and the software versions. ----

int StepInfo() {
  const int count = RequireGpu();
  cudaDeviceProp properties;
  CHECK_CUDA(cudaGetDeviceProperties(&properties, 0));
  int driver = 0, runtime = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  char bus[32] = {};
  CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), 0));
  Row("gpu 0", "%s (sm_%d%d, %d SMs, %.1f GiB)", properties.name, properties.major,
      properties.minor, properties.multiProcessorCount,
      static_cast<double>(properties.totalGlobalMem) / (1024.0 * kMiB));
  Row("gpus visible", "%d", count);
  Row("pci bus id", "%s", bus);
  Row("cuda driver / runtime", "%d.%d / %d.%d", driver / 1000, driver % 1000 / 10, runtime / 1000,
      runtime % 1000 / 10);
  return 0;
}

// ---- (2) CUDA IPC: export here, import in a fresh process. ----

std::string ToHex(const void* data, size_t bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < bytes; ++i) {
    const uint8_t byte = static_cast<const uint8_t*>(data)[i];
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

bool FromHex(const std::string& hex, void* out, size_t bytes) {
  if (hex.size() != 2 * bytes) return false;
  for (size_t i = 0; i < bytes; ++i) {
    unsigned value = 0;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &value) != 1) return false;
    static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(value);
  }
  return true;
}

int StepIpc() {
  RequireGpu();
  uint8_t* arena = nullptr;
  CHECK_CUDA(cudaMalloc(&arena, kIpcBytes));
  Fill(arena, kIpcBytes, kIpcSeed);
  cudaIpcMemHandle_t handle;
  CHECK_CUDA(cudaIpcGetMemHandle(&handle, arena));
  Row("ipc export", "%llu MiB cudaMalloc'd, pattern-filled, %zu-byte handle",
      static_cast<unsigned long long>(kIpcBytes / kMiB), sizeof(handle));

  // fork + exec: a forked child may not use the CUDA its parent initialised, and CUDA refuses to
  // import a handle into the process that exported it. The exec'd image is this program.
  const std::string hex = ToHex(&handle, sizeof(handle));
  const std::string bytes = std::to_string(kIpcBytes);
  const std::string seed = std::to_string(kIpcSeed);
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "gpu_check", "ipc-import", hex.c_str(), bytes.c_str(), seed.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid < 0) {
    fprintf(stderr, "FAIL: fork: %s\n", strerror(errno));
    return kExitFailed;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) {
    fprintf(stderr, "FAIL: waitpid for the importing process: %s\n", strerror(errno));
    return kExitFailed;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (WIFEXITED(status)) {
      fprintf(stderr, "FAIL: the importing process exited with %d%s\n", WEXITSTATUS(status),
              WEXITSTATUS(status) == 127 ? " (exec of /proc/self/exe failed)" : "");
    } else {
      fprintf(stderr, "FAIL: the importing process was killed by signal %d\n",
              WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    }
    return kExitFailed;
  }

  // The child's write is visible here, and nothing else changed.
  const bool ok =
      Verify("exporter, before the child's write", arena, kIpcWriteOffset, kIpcSeed, 0) &&
      Verify("exporter, the child's write", arena + kIpcWriteOffset, kIpcWriteBytes, kIpcWriteSeed,
             kIpcWriteOffset) &&
      Verify("exporter, after the child's write", arena + kIpcWriteOffset + kIpcWriteBytes,
             kIpcBytes - kIpcWriteOffset - kIpcWriteBytes, kIpcSeed,
             kIpcWriteOffset + kIpcWriteBytes);
  CHECK_CUDA(cudaFree(arena));
  if (!ok) return kExitFailed;
  Row("ipc write-back", "the child's %llu MiB seen by the exporter, the rest unchanged: ok",
      static_cast<unsigned long long>(kIpcWriteBytes / kMiB));
  return 0;
}

// The IPC step's child: import, verify samples, write a region back.
int StepIpcImport(const std::string& hex, uint64_t bytes, uint64_t seed) {
  RequireGpu();
  cudaIpcMemHandle_t handle;
  if (!FromHex(hex, &handle, sizeof(handle)) || bytes < kIpcWriteOffset + kIpcWriteBytes) {
    fprintf(stderr, "FAIL: ipc-import: a bad handle or size\n");
    return kExitUsage;
  }
  const double start = Seconds();
  void* mapped = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
  const double opened = Seconds();
  uint8_t* arena = static_cast<uint8_t*>(mapped);

  // Samples spread over the whole arena, the last one ending at its last byte.
  std::vector<uint8_t> sample(kIpcSampleBytes);
  for (int i = 0; i < kIpcSamples; ++i) {
    const uint64_t offset = (bytes - kIpcSampleBytes) / (kIpcSamples - 1) * i;
    const uint64_t at = i == kIpcSamples - 1 ? bytes - kIpcSampleBytes : offset;
    CHECK_CUDA(cudaMemcpy(sample.data(), arena + at, kIpcSampleBytes, cudaMemcpyDeviceToHost));
    for (uint64_t j = 0; j < kIpcSampleBytes; ++j) {
      if (sample[j] != PatternByte(seed, at + j)) {
        fprintf(stderr, "FAIL: ipc import: byte %llu is 0x%02x, the pattern says 0x%02x\n",
                static_cast<unsigned long long>(at + j), sample[j], PatternByte(seed, at + j));
        return kExitFailed;
      }
    }
  }
  Fill(arena + kIpcWriteOffset, kIpcWriteBytes, kIpcWriteSeed, kIpcWriteOffset);
  CHECK_CUDA(cudaIpcCloseMemHandle(mapped));
  Row("ipc import (another process)",
      "cudaIpcOpenMemHandle %.1f ms; %d samples x %llu B verified; wrote %llu MiB back",
      (opened - start) * 1e3, kIpcSamples, static_cast<unsigned long long>(kIpcSampleBytes),
      static_cast<unsigned long long>(kIpcWriteBytes / kMiB));
  return 0;
}

// ---- (3) Copy bandwidth between host and device. ----

// GB/s of `iterations` copies of `bytes` on `stream`, after two unmeasured ones.
double CopyRate(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind, int iterations,
                cudaStream_t stream) {
  for (int i = 0; i < 2; ++i) CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const double start = Seconds();
  for (int i = 0; i < iterations; ++i) CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  return static_cast<double>(bytes) * iterations / (Seconds() - start) / kGB;
}

int StepBandwidth() {
  RequireGpu();
  constexpr uint64_t kBytes = 64 * kMiB;
  constexpr int kPinnedIterations = 16;
  constexpr int kPageableIterations = 8;
  uint8_t *device = nullptr, *device2 = nullptr, *pinned = nullptr, *pinned2 = nullptr;
  CHECK_CUDA(cudaMalloc(&device, kBytes));
  CHECK_CUDA(cudaMalloc(&device2, kBytes));
  CHECK_CUDA(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault));
  CHECK_CUDA(cudaHostAlloc(&pinned2, kBytes, cudaHostAllocDefault));
  // Touched, so that first-touch page faults are not counted as copy time.
  std::vector<uint8_t> pageable(kBytes, 1);
  memset(pinned, 2, kBytes);
  memset(pinned2, 3, kBytes);
  cudaStream_t stream, stream2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream2, cudaStreamNonBlocking));

  const char* shape = "GB/s (64 MiB copies, cudaMemcpyAsync)";
  Row("device -> host, pinned", "%6.1f %s x%d",
      CopyRate(pinned, device, kBytes, cudaMemcpyDeviceToHost, kPinnedIterations, stream), shape,
      kPinnedIterations);
  Row("host -> device, pinned", "%6.1f %s x%d",
      CopyRate(device, pinned, kBytes, cudaMemcpyHostToDevice, kPinnedIterations, stream), shape,
      kPinnedIterations);
  Row("device -> host, pageable", "%6.1f %s x%d",
      CopyRate(pageable.data(), device, kBytes, cudaMemcpyDeviceToHost, kPageableIterations,
               stream),
      shape, kPageableIterations);
  Row("host -> device, pageable", "%6.1f %s x%d",
      CopyRate(device, pageable.data(), kBytes, cudaMemcpyHostToDevice, kPageableIterations,
               stream),
      shape, kPageableIterations);

  // Both directions at once, on two streams: a node that sends one room while it receives
  // another stages both ways over the same link.
  const double start = Seconds();
  for (int i = 0; i < kPinnedIterations; ++i) {
    CHECK_CUDA(cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaMemcpyAsync(device2, pinned2, kBytes, cudaMemcpyHostToDevice, stream2));
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamSynchronize(stream2));
  Row("both directions at once, pinned", "%6.1f GB/s in total (64 MiB each way) x%d",
      2.0 * kBytes * kPinnedIterations / (Seconds() - start) / kGB, kPinnedIterations);

  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaStreamDestroy(stream2));
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFreeHost(pinned2));
  CHECK_CUDA(cudaFree(device));
  CHECK_CUDA(cudaFree(device2));
  return 0;
}

// ---- (4) A GPU-arena room through the staging path, as CudaStaging does it. ----

struct Staging {
  uint8_t* pinned = nullptr;  // kDepth chunks of kChunkBytes
  cudaStream_t stream = nullptr;
  cudaEvent_t events[kDepth] = {};
  uint8_t* chunk(int slot) const { return pinned + static_cast<uint64_t>(slot) * kChunkBytes; }
};

// The pinned chunks, the stream and the events, as CudaStaging::Create makes them.
Staging MakeStaging() {
  Staging s;
  CHECK_CUDA(cudaHostAlloc(&s.pinned, kDepth * kChunkBytes, cudaHostAllocDefault));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  for (cudaEvent_t& event : s.events) {
    CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  return s;
}

void Release(Staging& s) {
  for (cudaEvent_t event : s.events) CHECK_CUDA(cudaEventDestroy(event));
  CHECK_CUDA(cudaStreamDestroy(s.stream));
  CHECK_CUDA(cudaFreeHost(s.pinned));
}

// CudaStaging::StageOut: `depth` chunks copied ahead; chunk i + depth is issued into chunk i's
// buffer only after chunk i was handed on (here: memcpy to the wire, the transport's stand-in).
void StageOut(Staging& s, const uint8_t* device, uint64_t length, uint8_t* wire) {
  const uint64_t chunks = (length + kChunkBytes - 1) / kChunkBytes;
  const auto issue = [&](uint64_t index) {
    const int slot = static_cast<int>(index % kDepth);
    const uint64_t offset = index * kChunkBytes;
    const uint64_t bytes = std::min(kChunkBytes, length - offset);
    CHECK_CUDA(
        cudaMemcpyAsync(s.chunk(slot), device + offset, bytes, cudaMemcpyDeviceToHost, s.stream));
    CHECK_CUDA(cudaEventRecord(s.events[slot], s.stream));
  };
  uint64_t issued = 0;
  while (issued < chunks && issued < static_cast<uint64_t>(kDepth)) issue(issued++);
  for (uint64_t next = 0; next < chunks; ++next) {
    const int slot = static_cast<int>(next % kDepth);
    const uint64_t offset = next * kChunkBytes;
    CHECK_CUDA(cudaEventSynchronize(s.events[slot]));
    memcpy(wire + offset, s.chunk(slot), std::min(kChunkBytes, length - offset));
    if (issued < chunks) issue(issued++);
  }
}

struct Scatter {
  const uint8_t* host;
  uint8_t* device;
  uint64_t length;
};

// CudaStaging::ScatterIn: pieces packed into the current chunk, one H2D copy per piece; a full
// chunk's event is recorded and the next chunk is reused once its earlier copies are done.
void ScatterIn(Staging& s, const std::vector<Scatter>& scatters) {
  bool recorded[kDepth] = {};
  int slot = 0;
  uint64_t used = 0;
  for (const Scatter& scatter : scatters) {
    const uint8_t* host = scatter.host;
    uint8_t* device = scatter.device;
    uint64_t remaining = scatter.length;
    while (remaining > 0) {
      if (used == kChunkBytes) {
        CHECK_CUDA(cudaEventRecord(s.events[slot], s.stream));
        recorded[slot] = true;
        slot = (slot + 1) % kDepth;
        used = 0;
        if (recorded[slot]) CHECK_CUDA(cudaEventSynchronize(s.events[slot]));
      }
      const uint64_t bytes = std::min(remaining, kChunkBytes - used);
      memcpy(s.chunk(slot) + used, host, bytes);
      CHECK_CUDA(
          cudaMemcpyAsync(device, s.chunk(slot) + used, bytes, cudaMemcpyHostToDevice, s.stream));
      used += bytes;
      host += bytes;
      device += bytes;
      remaining -= bytes;
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(s.stream));
}

int StepStaging() {
  RequireGpu();
  constexpr uint64_t kSeed = 0x57a9;
  uint8_t *from = nullptr, *to = nullptr;
  CHECK_CUDA(cudaMalloc(&from, kRoomBytes));
  CHECK_CUDA(cudaMalloc(&to, kRoomBytes));
  Fill(from, kRoomBytes, kSeed);
  // The wire: resident host memory, as a transport's registered buffers are.
  std::vector<uint8_t> wire(kRoomBytes, 0);
  Staging s = MakeStaging();
  std::vector<Scatter> scatters;
  for (uint64_t offset = 0; offset < kRoomBytes; offset += kScatterBytes) {
    scatters.push_back({wire.data() + offset, to + offset, kScatterBytes});
  }

  std::vector<double> out_rates, in_rates, total_rates;
  for (int run = 0; run < kStagingRuns; ++run) {
    CHECK_CUDA(cudaMemset(to, 0, kRoomBytes));
    memset(wire.data(), 0, kRoomBytes);
    CHECK_CUDA(cudaDeviceSynchronize());
    const double start = Seconds();
    StageOut(s, from, kRoomBytes, wire.data());
    const double staged = Seconds();
    ScatterIn(s, scatters);
    const double landed = Seconds();
    if (!Verify("staging: the second arena", to, kRoomBytes, kSeed, 0)) return kExitFailed;
    out_rates.push_back(kRoomBytes / (staged - start) / kGB);
    in_rates.push_back(kRoomBytes / (landed - staged) / kGB);
    total_rates.push_back(kRoomBytes / (landed - start) / kGB);
  }
  std::sort(out_rates.begin(), out_rates.end());
  std::sort(in_rates.begin(), in_rates.end());
  std::sort(total_rates.begin(), total_rates.end());
  const int median = kStagingRuns / 2;
  Row("staging room", "%llu MiB, %llu MiB chunks x %d in flight, %d runs, byte-exact: ok",
      static_cast<unsigned long long>(kRoomBytes / kMiB),
      static_cast<unsigned long long>(kChunkBytes / kMiB), kDepth, kStagingRuns);
  Row("  stage out (D2H + memcpy to wire)", "%6.1f GB/s median, %.1f best", out_rates[median],
      out_rates.back());
  Row("  scatter in (memcpy + H2D, 1 MiB)", "%6.1f GB/s median, %.1f best", in_rates[median],
      in_rates.back());
  Row("  end to end", "%6.1f GB/s median, %.1f best", total_rates[median], total_rates.back());

  Release(s);
  CHECK_CUDA(cudaFree(from));
  CHECK_CUDA(cudaFree(to));
  return 0;
}

// ---- (5) Head-sliced rows through the staging path: a copy per row against one 2-D copy a
// chunk, as CudaStaging::StageOutRows and a Scatter of rows do it (issue 31). ----

// A TP-2 prefill rank's half of each 2 KiB row of a TP-1 page: 1 KiB rows, 2 KiB apart, 64 MiB of
// them, through the 4 MiB chunks.
constexpr uint64_t kRowBytes = 1024;
constexpr uint64_t kRowPitch = 2048;
constexpr uint64_t kRows = 64 * kMiB / kRowBytes;
constexpr int kRowRuns = 3;

// Gathers every row of `device` (kRows rows at kRowPitch) into `wire` back to back, through the
// chunks: per row one cudaMemcpyAsync, or per chunk one cudaMemcpy2DAsync.
void GatherRows(Staging& s, const uint8_t* device, uint8_t* wire, bool two_d) {
  const uint64_t per_chunk = kChunkBytes / kRowBytes;
  const uint64_t chunks = (kRows + per_chunk - 1) / per_chunk;
  const auto rows_of = [&](uint64_t i) { return std::min(per_chunk, kRows - i * per_chunk); };
  const auto issue = [&](uint64_t index) {
    const int slot = static_cast<int>(index % kDepth);
    const uint64_t first = index * per_chunk;
    if (two_d) {
      CHECK_CUDA(cudaMemcpy2DAsync(s.chunk(slot), kRowBytes, device + first * kRowPitch, kRowPitch,
                                   kRowBytes, rows_of(index), cudaMemcpyDeviceToHost, s.stream));
    } else {
      for (uint64_t r = 0; r < rows_of(index); ++r) {
        CHECK_CUDA(cudaMemcpyAsync(s.chunk(slot) + r * kRowBytes, device + (first + r) * kRowPitch,
                                   kRowBytes, cudaMemcpyDeviceToHost, s.stream));
      }
    }
    CHECK_CUDA(cudaEventRecord(s.events[slot], s.stream));
  };
  uint64_t issued = 0;
  while (issued < chunks && issued < static_cast<uint64_t>(kDepth)) issue(issued++);
  for (uint64_t next = 0; next < chunks; ++next) {
    const int slot = static_cast<int>(next % kDepth);
    CHECK_CUDA(cudaEventSynchronize(s.events[slot]));
    memcpy(wire + next * per_chunk * kRowBytes, s.chunk(slot), rows_of(next) * kRowBytes);
    if (issued < chunks) issue(issued++);
  }
}

// Scatters `wire` (kRows rows back to back) onto `device` at kRowPitch through the chunks: per
// row one cudaMemcpyAsync, or per chunk one cudaMemcpy2DAsync.
void ScatterRows(Staging& s, const uint8_t* wire, uint8_t* device, bool two_d) {
  const uint64_t per_chunk = kChunkBytes / kRowBytes;
  bool recorded[kDepth] = {};
  for (uint64_t first = 0, index = 0; first < kRows; first += per_chunk, ++index) {
    const int slot = static_cast<int>(index % kDepth);
    if (recorded[slot]) CHECK_CUDA(cudaEventSynchronize(s.events[slot]));
    const uint64_t count = std::min(per_chunk, kRows - first);
    memcpy(s.chunk(slot), wire + first * kRowBytes, count * kRowBytes);
    if (two_d) {
      CHECK_CUDA(cudaMemcpy2DAsync(device + first * kRowPitch, kRowPitch, s.chunk(slot), kRowBytes,
                                   kRowBytes, count, cudaMemcpyHostToDevice, s.stream));
    } else {
      for (uint64_t r = 0; r < count; ++r) {
        CHECK_CUDA(cudaMemcpyAsync(device + (first + r) * kRowPitch, s.chunk(slot) + r * kRowBytes,
                                   kRowBytes, cudaMemcpyHostToDevice, s.stream));
      }
    }
    CHECK_CUDA(cudaEventRecord(s.events[slot], s.stream));
    recorded[slot] = true;
  }
  CHECK_CUDA(cudaStreamSynchronize(s.stream));
}

int StepRows() {
  RequireGpu();
  constexpr uint64_t kSeed = 0x0f5;
  constexpr uint64_t kSpan = kRows * kRowPitch;
  uint8_t *from = nullptr, *to = nullptr;
  CHECK_CUDA(cudaMalloc(&from, kSpan));
  CHECK_CUDA(cudaMalloc(&to, kSpan));
  Fill(from, kSpan, kSeed);
  std::vector<uint8_t> wire(kRows * kRowBytes), expected(kSpan), landed(kSpan);
  CHECK_CUDA(cudaMemcpy(expected.data(), from, kSpan, cudaMemcpyDeviceToHost));
  Staging s = MakeStaging();
  const double bytes = static_cast<double>(kRows * kRowBytes);
  double gather_gbps[2] = {}, scatter_gbps[2] = {};  // [per row, 2-D]: medians
  for (const bool two_d : {false, true}) {
    std::vector<double> gathers, scatters;
    for (int run = 0; run < kRowRuns; ++run) {
      CHECK_CUDA(cudaMemset(to, 0, kSpan));
      memset(wire.data(), 0, wire.size());
      CHECK_CUDA(cudaDeviceSynchronize());
      const double start = Seconds();
      GatherRows(s, from, wire.data(), two_d);
      const double gathered = Seconds();
      ScatterRows(s, wire.data(), to, two_d);
      const double scattered = Seconds();
      gathers.push_back(bytes / (gathered - start) / kGB);
      scatters.push_back(bytes / (scattered - gathered) / kGB);
      // The rows landed where they came from; the bytes between them stayed zero.
      CHECK_CUDA(cudaMemcpy(landed.data(), to, kSpan, cudaMemcpyDeviceToHost));
      for (uint64_t i = 0; i < kSpan; ++i) {
        const uint8_t want = i % kRowPitch < kRowBytes ? expected[i] : 0;
        if (landed[i] != want) {
          Row("head-sliced rows", "FAILED: byte %llu is %u, expected %u (%s copies)",
              static_cast<unsigned long long>(i), landed[i], want, two_d ? "2-D" : "per-row");
          return kExitFailed;
        }
      }
    }
    std::sort(gathers.begin(), gathers.end());
    std::sort(scatters.begin(), scatters.end());
    gather_gbps[two_d] = gathers[kRowRuns / 2];
    scatter_gbps[two_d] = scatters[kRowRuns / 2];
  }
  Row("head-sliced rows", "%llu MiB of %llu-byte rows %llu apart, %d runs, byte-exact: ok",
      static_cast<unsigned long long>(kRows * kRowBytes / kMiB),
      static_cast<unsigned long long>(kRowBytes), static_cast<unsigned long long>(kRowPitch),
      kRowRuns);
  Row("  gather (D2H), a copy per row", "%6.1f GB/s median", gather_gbps[0]);
  Row("  gather (D2H), 2-D a chunk", "%6.1f GB/s median (%.1fx)", gather_gbps[1],
      gather_gbps[1] / gather_gbps[0]);
  Row("  scatter (H2D), a copy per row", "%6.1f GB/s median", scatter_gbps[0]);
  Row("  scatter (H2D), 2-D a chunk", "%6.1f GB/s median (%.1fx)", scatter_gbps[1],
      scatter_gbps[1] / scatter_gbps[0]);
  Release(s);
  CHECK_CUDA(cudaFree(from));
  CHECK_CUDA(cudaFree(to));
  return 0;
}

// ---- (6) What GPUDirect would need: dmabuf export, nvidia_peermem, libibverbs. ----

// A driver API function, through the runtime (cudaGetDriverEntryPointByVersion), so that the
// program links no libcuda and still starts, and says "no GPU", where no driver is installed.
void* DriverFunction(const char* name) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(name, &function, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
  return function;
}

bool Exists(const char* path) {
  struct stat info;
  return stat(path, &info) == 0;
}

int StepDmabuf() {
  RequireGpu();
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  using GetHandleForAddressRange =
      CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
  const auto device_get = reinterpret_cast<DeviceGet>(DriverFunction("cuDeviceGet"));
  const auto get_attribute =
      reinterpret_cast<DeviceGetAttribute>(DriverFunction("cuDeviceGetAttribute"));
  const auto get_handle =
      reinterpret_cast<GetHandleForAddressRange>(DriverFunction("cuMemGetHandleForAddressRange"));
  CHECK_CUDA(cudaFree(nullptr));  // the primary context, which the driver calls below need

  CUdevice device = 0;
  if (device_get == nullptr || get_attribute == nullptr || device_get(&device, 0) != CUDA_SUCCESS) {
    Row("driver api", "cuDeviceGet / cuDeviceGetAttribute not found: attributes unknown");
  } else {
    const struct {
      const char* name;
      CUdevice_attribute attribute;
    } attributes[] = {
        {"dmabuf supported (attribute)", CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED},
        {"gpudirect rdma supported", CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED},
    };
    for (const auto& a : attributes) {
      int value = -1;
      const CUresult result = get_attribute(&value, a.attribute, device);
      if (result == CUDA_SUCCESS) {
        Row(a.name, "%s", value ? "yes" : "no");
      } else {
        Row(a.name, "unknown (cuDeviceGetAttribute returned CUresult %d)",
            static_cast<int>(result));
      }
    }
  }

  // The attribute is deprecated in CUDA 13; asking for a dmabuf fd of real memory is the answer
  // that counts (what ibv_reg_dmabuf_mr would be given).
  constexpr uint64_t kBytes = 2 * kMiB;
  uint8_t* memory = nullptr;
  CHECK_CUDA(cudaMalloc(&memory, kBytes));
  if (get_handle == nullptr) {
    Row("dmabuf export (2 MiB cudaMalloc)", "no: the driver has no cuMemGetHandleForAddressRange");
  } else {
    int fd = -1;
    const CUresult result = get_handle(&fd, reinterpret_cast<CUdeviceptr>(memory), kBytes,
                                       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (result == CUDA_SUCCESS && fd >= 0) {
      Row("dmabuf export (2 MiB cudaMalloc)", "yes (cuMemGetHandleForAddressRange gave an fd)");
      close(fd);
    } else {
      Row("dmabuf export (2 MiB cudaMalloc)", "no (cuMemGetHandleForAddressRange: CUresult %d)",
          static_cast<int>(result));
    }
  }
  CHECK_CUDA(cudaFree(memory));

  Row("nvidia_peermem loaded", "%s", Exists("/sys/module/nvidia_peermem") ? "yes" : "no");
  void* verbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  Row("libibverbs.so.1 loadable", "%s", verbs != nullptr ? "yes" : "no");
  if (verbs != nullptr) dlclose(verbs);
  int rdma_devices = 0;
  if (DIR* dir = opendir("/sys/class/infiniband")) {
    while (const dirent* entry = readdir(dir)) rdma_devices += entry->d_name[0] != '.';
    closedir(dir);
  }
  Row("rdma devices (/sys/class/infiniband)", "%d", rdma_devices);
  return 0;
}

int Usage() {
  fprintf(stderr,
          "usage: gpu_check [all|info|ipc|bandwidth|staging|rows|dmabuf]\n"
          "       gpu_check ipc-import HEX BYTES SEED   (internal: the ipc step's child)\n");
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode == "ipc-import") {
    if (argc != 5) return Usage();
    return StepIpcImport(argv[2], strtoull(argv[3], nullptr, 10), strtoull(argv[4], nullptr, 10));
  }
  if (argc > 2) return Usage();
  if (mode == "info") return StepInfo();
  if (mode == "ipc") return StepIpc();
  if (mode == "bandwidth") return StepBandwidth();
  if (mode == "staging") return StepStaging();
  if (mode == "rows") return StepRows();
  if (mode == "dmabuf") return StepDmabuf();
  if (mode != "all") return Usage();
  int failed = 0;
  for (int (*step)() : {StepInfo, StepIpc, StepBandwidth, StepStaging, StepRows, StepDmabuf}) {
    failed |= step() != 0;
  }
  return failed ? kExitFailed : 0;
}
