#include "tests/support/kvrail_binary.h"

#include <climits>
#include <cstdlib>

namespace kvrail::testing {

std::string KvrailBinary() {
  char resolved[PATH_MAX];
  return realpath("tools/kvrail", resolved) != nullptr ? resolved : "tools/kvrail";
}

}  // namespace kvrail::testing
