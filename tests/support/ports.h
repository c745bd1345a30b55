// Free TCP ports for tests that must name a port before a process binds it.
#ifndef KVRAIL_TESTS_SUPPORT_PORTS_H_
#define KVRAIL_TESTS_SUPPORT_PORTS_H_

#include "absl/status/statusor.h"

namespace kvrail::testing {

// A TCP port on 127.0.0.1 the kernel had free just now (bound to port 0, then released): free
// for a moment, so a test that needs it bound for sure binds it itself.
absl::StatusOr<int> FreePort();

}  // namespace kvrail::testing

#endif  // KVRAIL_TESTS_SUPPORT_PORTS_H_
