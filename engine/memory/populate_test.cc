#include "engine/memory/populate.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/memory/resident_pages.h"

namespace kvrail {
namespace {

using ::kvrail::testing::ResidentPages;

// A fresh shared mapping holds no page until one is written; populated, it holds every page,
// and its bytes are unchanged.
TEST(PopulateTest, EveryPageIsResidentAndTheBytesStay) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = 256 * page;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(base);
  EXPECT_EQ(ResidentPages(base, length), 0u);
  bytes[3 * page + 5] = 0xab;  // one page written before
  ASSERT_TRUE(PopulatePages(base, length).ok());
  EXPECT_EQ(ResidentPages(base, length), 256u);
  for (size_t i = 0; i < length; ++i) {
    ASSERT_EQ(bytes[i], i == 3 * page + 5 ? 0xab : 0) << i;
  }
  munmap(base, length);
}

// An unaligned range populates the pages it touches, and only those.
TEST(PopulateTest, AnUnalignedRangePopulatesThePagesItTouches) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = 16 * page;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  ASSERT_TRUE(PopulatePages(static_cast<uint8_t*>(base) + page + 100, 2 * page).ok());
  EXPECT_EQ(ResidentPages(base, length), 3u);  // pages 1, 2 and 3
  munmap(base, length);
}

TEST(PopulateTest, ARefusalNamesTheRange) {
  EXPECT_EQ(PopulatePages(nullptr, 4096).code(), absl::StatusCode::kInvalidArgument);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* base = mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(base, MAP_FAILED);
  const absl::Status status = PopulatePages(base, page);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("MADV_POPULATE_WRITE"), std::string::npos) << status;
  munmap(base, page);
}

}  // namespace
}  // namespace kvrail
