// The fence suite (fence_suite.h) over UCX tcp and shared memory on the host's loopback.
#include "tests/chaos/fence_suite.h"

namespace kvrail::chaos {
namespace {

INSTANTIATE_TEST_SUITE_P(Transports, FenceTest, ::testing::Values("tcp", "sm", "verbs"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvrail::chaos
