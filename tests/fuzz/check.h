// The harnesses' one assertion: a property that does not hold ends the process, so that the
// mutation driver fails its test and libFuzzer keeps the input as a crash.
#ifndef KVRAIL_TESTS_FUZZ_CHECK_H_
#define KVRAIL_TESTS_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace kvrail::fuzz {

// Aborts, printing `what`, unless `condition` holds.
inline void Check(bool condition, absl::string_view what) {
  if (condition) return;
  std::fprintf(stderr, "fuzz property broken: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

// The same, for a message worth building only when the property fails (harnesses run millions
// of times a minute): `describe` returns it.
template <typename Describe, typename = std::enable_if_t<std::is_invocable_v<Describe>>>
void Check(bool condition, Describe&& describe) {
  if (condition) return;
  const std::string what = describe();
  Check(false, what);
}

}  // namespace kvrail::fuzz

#endif  // KVRAIL_TESTS_FUZZ_CHECK_H_
