// Tests' count of the resident pages of a mapping (mincore: for a shared mapping, the pages the
// page cache holds, which a write or a populate fills).
#ifndef KVRAIL_ENGINE_MEMORY_RESIDENT_PAGES_H_
#define KVRAIL_ENGINE_MEMORY_RESIDENT_PAGES_H_

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <vector>

namespace kvrail::testing {

inline size_t ResidentPages(void* base, size_t length) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((length + page - 1) / page);
  EXPECT_EQ(mincore(base, length, resident.data()), 0);
  size_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

}  // namespace kvrail::testing

#endif  // KVRAIL_ENGINE_MEMORY_RESIDENT_PAGES_H_
