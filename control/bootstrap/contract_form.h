// The two forms of a contract wire the bootstrap writes: the snapshot's (CACHEPD §4.1) and
// 2026-09's, which adds replayable and shard_count to every group spec and resident_block_bytes
// to the plan (CACHEPD §12.1). Reading either is plan::ParseContractOfEitherForm.
//
// TEMPORARY ADAPTER. layout::SerializeContract writes only the snapshot form for now. Once the
// layout package gains SerializeContract(contract, revision), the function below becomes a
// one-line call to it and this file goes.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_CONTRACT_FORM_H_
#define KVRAIL_CONTROL_BOOTSTRAP_CONTRACT_FORM_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/layout/revision.h"

namespace kvrail::bootstrap {

// The canonical wire (CACHEPD §4.2) of `contract` in the form of `revision`. The snapshot form
// cannot say shard_count != 1, replayable or resident_block_bytes: writing a contract that uses
// them in that form fails (invalid-contract) naming the member and the revision.
absl::StatusOr<std::string> SerializeContractIn(const layout::Contract& contract,
                                                layout::Revision revision);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_CONTRACT_FORM_H_
