// Skips for the CUDA tests of engine/memory (cuda_arena_test.cc, cuda_staging_test.cc): GPU-only
// checks skip, saying why, where no GPU is lent.
#ifndef KVRAIL_ENGINE_MEMORY_CUDA_TEST_SUPPORT_H_
#define KVRAIL_ENGINE_MEMORY_CUDA_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "engine/memory/cuda_arena.h"

#ifndef KVRAIL_HAVE_CUDA
#error "KVRAIL_HAVE_CUDA must come from @cuda//:config"
#endif

// GPU-only checks skip, saying why, when CudaAvailable() is not OK (no toolkit, driver or GPU).
#define SKIP_WITHOUT_GPU()                                                \
  do {                                                                    \
    const absl::Status gpu = ::kvrail::CudaAvailable();                   \
    if (!gpu.ok()) GTEST_SKIP() << "needs a CUDA GPU: " << gpu.message(); \
  } while (false)

// Argument checks that run before any CUDA call: they need the toolkit but no GPU.
#define SKIP_WITHOUT_TOOLKIT()                                                     \
  do {                                                                             \
    if (!KVRAIL_HAVE_CUDA) GTEST_SKIP() << "built without CUDA: nothing to check"; \
  } while (false)

#endif  // KVRAIL_ENGINE_MEMORY_CUDA_TEST_SUPPORT_H_
