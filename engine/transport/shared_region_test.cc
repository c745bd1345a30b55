#include "engine/transport/shared_region.h"

#include <sys/stat.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/memory/arena.h"
#include "gtest/gtest.h"

namespace kvrail::transport {
namespace {

bool SameFile(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_ino == sb.st_ino &&
         sa.st_dev == sb.st_dev;
}

TEST(FindBackingFdTest, FindsTheMemfdBehindAnArenaAndTheOffsetInIt) {
  auto arena = Arena::CreateMemfd("backing-test", 1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto found = FindBackingFd(arena->data() + 12345);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(SameFile(found->fd, arena->fd()));
  EXPECT_EQ(found->offset, 12345u);
  EXPECT_EQ(found->contiguous, (1u << 20) - 12345u);
  EXPECT_NE(found->path.find("backing-test"), std::string::npos) << found->path;
}

TEST(FindBackingFdTest, FindsANamedSharedMemoryObject) {
  const std::string name = "/kvrail-backing-test-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  auto arena = Arena::CreateShared(name, 64 << 10);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto found = FindBackingFd(arena->data());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(SameFile(found->fd, arena->fd()));
  EXPECT_EQ(found->offset, 0u);
}

TEST(FindBackingFdTest, AnonymousMemoryIsNotFoundAndSaysSo) {
  std::vector<char> heap(1 << 20);
  auto found = FindBackingFd(heap.data());
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(found.status().message().find("anonymous"), std::string::npos) << found.status();
}

TEST(FindBackingFdTest, AnUnmappedAddressIsNotFound) {
  auto found = FindBackingFd(reinterpret_cast<void*>(0x10));
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(found.status().message().find("not mapped"), std::string::npos) << found.status();
}

}  // namespace
}  // namespace kvrail::transport
