// Pages populated up front: the first write into a fresh anonymous or shared-memory page
// faults and zeroes it (about 250,000 faults per GiB), and a data plane whose first room lands
// on such pages pays that inside the room. An arena populated when it is attached pays it once,
// at attach, outside every room (kvrail issue 13, "a lean hot path"; docs/ARCHITECTURE.md).
#ifndef KVRAIL_ENGINE_MEMORY_POPULATE_H_
#define KVRAIL_ENGINE_MEMORY_POPULATE_H_

#include <cstddef>

#include "absl/status/status.h"

namespace kvrail {

// Makes every page of [base, base + length) resident and writable in this process's page
// table, leaving the bytes as they are: madvise(MADV_POPULATE_WRITE) (Linux 5.14), or, where
// the kernel lacks it, a write of each page's first byte back to itself. For memory this
// process mapped writable (an mmap, a shared segment): on an older kernel a read-only range
// faults. `base` need not be page-aligned (the pages it and the range touch are populated).
// InvalidArgument for a null base; the kernel's error, naming the range, when it refuses (a
// read-only mapping, out of memory).
absl::Status PopulatePages(void* base, size_t length);

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_MEMORY_POPULATE_H_
