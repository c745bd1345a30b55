// Fuzz harness: the contract parser (CACHEPD §4.3, §4.4; §12.1) and canonical serialiser (§4.2)
// of both revisions' forms. Properties: no crash, leak or undefined behaviour; every rejection
// carries the invalid-contract category; an accepted contract serialises in its own form unless
// that form cannot carry it (a snapshot-form wire with plan.resident_block_bytes set), and
// written in either form, the wire parses back as that form and writes the same wire again; the
// peer check of a contract against its re-read self passes (the snapshot form leaves replayable
// out, so a replayable contract re-read from it is the one exception).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "control/layout/contract.h"
#include "control/layout/revision.h"
#include "engine/base/error.h"
#include "tests/fuzz/check.h"

namespace {

using kvrail::CategoryOf;
using kvrail::ErrorCategory;
using kvrail::fuzz::Check;
namespace layout = kvrail::layout;

bool AnyReplayable(const layout::Contract& contract) {
  for (const layout::GroupSpec& spec : contract.group_specs) {
    if (spec.replayable) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string wire(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(wire);
  if (!contract.ok()) {
    Check(CategoryOf(contract.status()) == ErrorCategory::kInvalidContract,
          [&] { return contract.status().ToString(); });
    return 0;
  }
  Check(layout::SerializeContract(*contract).ok() ||
            (contract->revision == layout::Revision::kSnapshot &&
             contract->plan.resident_block_bytes.has_value()) ||
            layout::SerializeContract(*contract).status().message().find("exceeds") !=
                absl::string_view::npos,
        "an accepted contract writes in its own form");
  for (layout::Revision form : {layout::Revision::kSnapshot, layout::Revision::k2026_09}) {
    absl::StatusOr<std::string> canonical = layout::SerializeContract(*contract, form);
    if (!canonical.ok()) {  // the size cap after escaping, or a form that cannot carry it
      Check(CategoryOf(canonical.status()) == ErrorCategory::kInvalidContract,
            [&] { return canonical.status().ToString(); });
      continue;
    }
    absl::StatusOr<layout::Contract> again = layout::ParseContract(*canonical);
    Check(again.ok(), [&] {
      return absl::StrCat("a canonical ", layout::RevisionName(form),
                          " wire parses: ", again.status().ToString());
    });
    Check(again->revision == form, "a canonical wire parses as its form");
    Check(*layout::SerializeContract(*again) == *canonical, "canonical wires are fixed points");
    if (form == contract->revision || !AnyReplayable(*contract)) {
      Check(layout::CheckPeerContracts(*contract, *again).ok(), "a contract matches itself");
    }
  }
  (void)layout::CheckArenaFits(*contract);
  return 0;
}
