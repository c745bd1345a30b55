// The kvrail binary a test runs (a data dependency on //tools:kvrail), by absolute path, so that
// it survives `ip netns exec` and a changed working directory.
#ifndef KVRAIL_TESTS_SUPPORT_KVRAIL_BINARY_H_
#define KVRAIL_TESTS_SUPPORT_KVRAIL_BINARY_H_

#include <string>

namespace kvrail::testing {

// The absolute path of tools/kvrail in the test's runfiles ("tools/kvrail" if it is missing).
std::string KvrailBinary();

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_SUPPORT_KVRAIL_BINARY_H_
