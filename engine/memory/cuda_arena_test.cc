#include "engine/memory/cuda_arena.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/memory/cuda_test_support.h"
#include "engine/memory/pattern.h"

extern char** environ;

namespace kvrail {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CudaAvailableTest, SaysInOneLineWhyThereIsNoGpu) {
  const absl::Status status = CudaAvailable();
  if (status.ok()) GTEST_SKIP() << "a GPU is present; nothing to explain";
  EXPECT_EQ(status.message().find('\n'), absl::string_view::npos) << status;
#if KVRAIL_HAVE_CUDA
  // e.g. "no GPU: cudaGetDeviceCount returned 35 (cudaErrorInsufficientDriver: CUDA driver
  // version is insufficient for CUDA runtime version)"
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("no GPU: cudaGetDeviceCount "));
  const bool names_error = absl::StrContains(status.message(), " returned ") &&
                           absl::StrContains(status.message(), " (cudaError");
  const bool no_devices = absl::StrContains(status.message(), "found 0 devices");
  EXPECT_TRUE(names_error || no_devices) << status;
#else
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(std::string(status.message()), StartsWith("built without CUDA"));
#endif
}

TEST(CudaAvailableTest, WithoutGpuEveryFactoryReportsTheSameReason) {
  const absl::Status reason = CudaAvailable();
  if (reason.ok()) GTEST_SKIP() << "a GPU is present";
  const absl::Status allocate = CudaArena::Allocate(1 << 20, 0).status();
  EXPECT_EQ(allocate.code(), reason.code());
  EXPECT_THAT(std::string(allocate.message()), StartsWith("CUDA arena on device 0: "));
  EXPECT_THAT(std::string(allocate.message()), HasSubstr(reason.message()));

  const absl::Status import =
      ImportCudaIpc(std::string(kCudaIpcHandleBytes, '\0'), 1 << 20, 0).status();
  EXPECT_EQ(import.code(), reason.code());
  EXPECT_THAT(std::string(import.message()), StartsWith("CUDA IPC import on device 0: "));
  EXPECT_THAT(std::string(import.message()), HasSubstr(reason.message()));
}

TEST(CudaArenaArgumentsTest, ZeroSizeIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status = CudaArena::Allocate(0, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "CUDA arena on device 0: size 0: an arena holds at least one byte");
}

TEST(CudaArenaArgumentsTest, NegativeDeviceIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status = CudaArena::Allocate(4096, -1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "CUDA arena on device -1: device -1 is not a device index");
}

TEST(CudaArenaArgumentsTest, IpcHandleMustBe64Bytes) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status = ImportCudaIpc(std::string(63, 'h'), 4096, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "CUDA IPC import on device 0: the handle is 63 bytes; a cudaIpcMemHandle_t is "
            "exactly 64");
}

TEST(CudaArenaArgumentsTest, ImportOfZeroBytesIsRejected) {
  SKIP_WITHOUT_TOOLKIT();
  const absl::Status status = ImportCudaIpc(std::string(64, 'h'), 0, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("size 0"));
}

// ---- GPU only: these run where a GPU is lent, and skip elsewhere. ----

TEST(CudaArenaGpuTest, PatternFilledOnDeviceReadsBackOnHost) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = (1 << 20) + 13;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ(arena->kind(), MemoryKind::kCuda);
  EXPECT_EQ(arena->name(), "cuda:0");
  ASSERT_TRUE(arena->FillPattern(21).ok());
  std::vector<uint8_t> host(kBytes);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(host)).ok());
  EXPECT_EQ(FirstPatternMismatch(host, 21), std::nullopt);

  std::vector<uint8_t> slice(100);
  ASSERT_TRUE(arena->CopyToHost(4096, absl::MakeSpan(slice)).ok());
  EXPECT_EQ(FirstPatternMismatch(slice, 21, 4096), std::nullopt);
}

TEST(CudaArenaGpuTest, HostBytesRoundTrip) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(8192, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<uint8_t> in(8192);
  FillPattern(absl::MakeSpan(in), 4);
  ASSERT_TRUE(arena->CopyFromHost(0, in).ok());
  std::vector<uint8_t> out(8192);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(out)).ok());
  EXPECT_EQ(in, out);
}

TEST(CudaArenaGpuTest, CopiesOutsideTheArenaAreOutOfRange) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(4096, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<uint8_t> host(20);
  const absl::Status status = arena->CopyToHost(4086, absl::MakeSpan(host));
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(status.message(),
            "cuda:0: copy to host of 20 bytes at offset 4086 does not fit in the arena's 4096 "
            "bytes");
  EXPECT_EQ(arena->CopyFromHost(SIZE_MAX, host).code(), absl::StatusCode::kOutOfRange);
}

TEST(CudaArenaGpuTest, RecordIsTheDeviceRange) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(4096, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const RegionRecord record = RecordOf(*arena);
  EXPECT_EQ(record.base, reinterpret_cast<uintptr_t>(arena->data()));
  EXPECT_EQ(record.length, 4096u);
  EXPECT_EQ(record.kind, MemoryKind::kCuda);
  EXPECT_EQ(record.name, "cuda:0");
}

TEST(CudaArenaGpuTest, DeviceBeyondTheVisibleOnesIsRejected) {
  SKIP_WITHOUT_GPU();
  const absl::Status status = CudaArena::Allocate(4096, 4096).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("device 4096 is not visible"));
}

// The IPC tests re-run this test binary as a fresh process (fork + exec: CUDA must not be used
// in a child forked after the parent initialised it, and refuses imports into the exporting
// process). The child runs one CudaIpcChild test, told what to do by kChildEnv.
constexpr char kChildEnv[] = "KVRAIL_CUDA_IPC_CHILD";
constexpr int kChildDone = 86;  // a child exits with this only when its checks all passed

// Runs test `filter` of this binary in a new process with kChildEnv=`spec`; returns its exit
// code. Bazel's per-test outputs (XML report, sharding) are withheld from the child.
int RunChildTest(const std::string& filter, const std::string& spec) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    const absl::string_view key = text.substr(0, text.find('='));
    if (key == "XML_OUTPUT_FILE" || key == "GTEST_OUTPUT" || key == "TEST_SHARD_STATUS_FILE" ||
        key == "TEST_TOTAL_SHARDS" || key == "TEST_SHARD_INDEX" || key == "GTEST_TOTAL_SHARDS" ||
        key == "GTEST_SHARD_INDEX" || key == "TEST_PREMATURE_EXIT_FILE" || key == kChildEnv) {
      continue;
    }
    env.emplace_back(text);
  }
  env.push_back(absl::StrCat(kChildEnv, "=", spec));
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
  for (std::string& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::string program = "/proc/self/exe";
  std::string filter_flag = absl::StrCat("--gtest_filter=", filter);
  char* argv[] = {program.data(), filter_flag.data(), nullptr};

  const pid_t pid = fork();
  if (pid == 0) {
    execve(program.c_str(), argv, envp.data());
    _exit(127);
  }
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// kChildEnv is "<hex handle>:<bytes>:<seed to expect>:<seed to write>".
TEST(CudaIpcChild, ImportsVerifiesAndWrites) {
  const char* spec = std::getenv(kChildEnv);
  if (spec == nullptr) GTEST_SKIP() << "runs only as the child of CudaIpcTest";
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  ASSERT_EQ(parts.size(), 4u);
  size_t bytes = 0;
  uint64_t expect_seed = 0, write_seed = 0;
  ASSERT_TRUE(absl::SimpleAtoi(parts[1], &bytes));
  ASSERT_TRUE(absl::SimpleAtoi(parts[2], &expect_seed));
  ASSERT_TRUE(absl::SimpleAtoi(parts[3], &write_seed));
  {
    absl::StatusOr<CudaArena> imported = ImportCudaIpc(absl::HexStringToBytes(parts[0]), bytes, 0);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_TRUE(imported->imported());
    EXPECT_EQ(imported->name(), "cuda-ipc:0");
    EXPECT_EQ(imported->ExportIpcHandle().status().code(), absl::StatusCode::kFailedPrecondition);
    std::vector<uint8_t> host(bytes);
    ASSERT_TRUE(imported->CopyToHost(0, absl::MakeSpan(host)).ok());
    ASSERT_EQ(FirstPatternMismatch(host, expect_seed), std::nullopt);
    ASSERT_TRUE(imported->FillPattern(write_seed).ok());
  }
  std::_Exit(kChildDone);
}

// kChildEnv is "<hex handle>:<bytes>": more bytes than were exported.
TEST(CudaIpcChild, RejectsAnOversizedClaim) {
  const char* spec = std::getenv(kChildEnv);
  if (spec == nullptr) GTEST_SKIP() << "runs only as the child of CudaIpcTest";
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  ASSERT_EQ(parts.size(), 2u);
  size_t bytes = 0;
  ASSERT_TRUE(absl::SimpleAtoi(parts[1], &bytes));
  const absl::Status status = ImportCudaIpc(absl::HexStringToBytes(parts[0]), bytes, 0).status();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  ASSERT_THAT(std::string(status.message()), HasSubstr("exceeds the exported allocation's"));
  std::_Exit(kChildDone);
}

TEST(CudaIpcTest, AnotherProcessImportsTheHandleAndSharesTheBytes) {
  SKIP_WITHOUT_GPU();
  // A multiple of the allocation granularity, so the allocation is exactly this long.
  constexpr size_t kBytes = 2 << 20;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(arena->FillPattern(11).ok());
  absl::StatusOr<std::string> handle = arena->ExportIpcHandle();
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_EQ(handle->size(), kCudaIpcHandleBytes);

  ASSERT_EQ(RunChildTest("CudaIpcChild.ImportsVerifiesAndWrites",
                         absl::StrCat(absl::BytesToHexString(*handle), ":", kBytes, ":11:12")),
            kChildDone);
  std::vector<uint8_t> host(kBytes);
  ASSERT_TRUE(arena->CopyToHost(0, absl::MakeSpan(host)).ok());
  EXPECT_EQ(FirstPatternMismatch(host, 12), std::nullopt);
}

TEST(CudaIpcTest, ImportClaimingMoreThanTheAllocationIsRejected) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kBytes = 2 << 20;
  absl::StatusOr<CudaArena> arena = CudaArena::Allocate(kBytes, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  absl::StatusOr<std::string> handle = arena->ExportIpcHandle();
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(RunChildTest("CudaIpcChild.RejectsAnOversizedClaim",
                         absl::StrCat(absl::BytesToHexString(*handle), ":", kBytes + 1)),
            kChildDone);
}

}  // namespace
}  // namespace kvrail
