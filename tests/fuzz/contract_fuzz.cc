// Fuzz harness: the contract parser (CACHEPD §4.3, §4.4) and canonical serialiser (§4.2).
// Properties: no crash, leak or undefined behaviour; every rejection carries the
// invalid-contract category; an accepted contract serialises, and its canonical wire parses
// back to the same canonical wire; the peer check of a contract against itself passes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "control/layout/contract.h"
#include "engine/base/error.h"

namespace {

using kvrail::CategoryOf;
using kvrail::ErrorCategory;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string wire(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvrail::layout::Contract> contract = kvrail::layout::ParseContract(wire);
  if (!contract.ok()) {
    if (CategoryOf(contract.status()) != ErrorCategory::kInvalidContract) std::abort();
    return 0;
  }
  absl::StatusOr<std::string> canonical = kvrail::layout::SerializeContract(*contract);
  if (!canonical.ok()) return 0;  // may exceed the size cap after escaping
  absl::StatusOr<kvrail::layout::Contract> again = kvrail::layout::ParseContract(*canonical);
  if (!again.ok() || *kvrail::layout::SerializeContract(*again) != *canonical) std::abort();
  if (!kvrail::layout::CheckPeerContracts(*contract, *again).ok()) std::abort();
  (void)kvrail::layout::CheckArenaFits(*contract);
  return 0;
}
