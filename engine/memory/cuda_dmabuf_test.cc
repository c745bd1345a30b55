// dmabuf export of GPU memory (cuda_dmabuf.h): refused in one line without a GPU; with one, a
// dmabuf of an arena's range, widened to whole pages.
#include "engine/memory/cuda_dmabuf.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "engine/memory/cuda_arena.h"
#include "engine/memory/cuda_test_support.h"
#include "gtest/gtest.h"

namespace kvrail {
namespace {

TEST(CudaDmabuf, WithoutAGpuEveryCallSaysWhyInOneLine) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "this host has a GPU";
  for (const absl::Status& status :
       {CudaDmabufSupported(0), ExportCudaDmabuf(reinterpret_cast<void*>(0x1000), 4096).status()}) {
    EXPECT_FALSE(status.ok());
    const std::string message(status.message());
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(CudaDmabuf, ANullRangeIsRefusedBeforeAnyCudaCall) {
  EXPECT_EQ(ExportCudaDmabuf(nullptr, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportCudaDmabuf(reinterpret_cast<void*>(0x1000), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaDmabuf, PeermemIsSeenInSysfs) {
  const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/module");
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", root, "/nvidia_peermem").c_str()), 0);
  EXPECT_TRUE(NvidiaPeermemLoaded(root));
  EXPECT_FALSE(NvidiaPeermemLoaded(absl::StrCat(root, "/none")));
}

TEST(CudaDmabuf, AnArenasRangeExportsAsADmabufOfWholePages) {
  SKIP_WITHOUT_GPU();
  if (!CudaDmabufSupported(0).ok()) GTEST_SKIP() << CudaDmabufSupported(0).message();
  auto arena = CudaArena::Allocate(uint64_t{64} << 20, 0);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto dmabuf = ExportCudaDmabuf(arena->data() + 100, 4096);
  ASSERT_TRUE(dmabuf.ok()) << dmabuf.status();
  EXPECT_GE(dmabuf->fd, 0);
  EXPECT_EQ(dmabuf->offset % static_cast<uint64_t>(sysconf(_SC_PAGESIZE)), 100u);
  close(dmabuf->fd);
}

}  // namespace
}  // namespace kvrail
