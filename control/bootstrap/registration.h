// A prefill rank's registration with the bootstrap server: the JSON body of `PUT /route`,
// read by the server and written by the client. Two forms (CACHEPD §2.1, §12.3):
//
// 2026-09 (§12.3; the contract in 2026-09's form, §12.1), members in this order:
//   {"role": "Prefill", "world_size": 4, "dp_size": 1, "pp_size": 2,
//    "cache_fields_by_stage": [["layer.0.k"], ["layer.1.k"]],
//    "rank_ip": "10.2.0.1", "rank_port": 18001, "engine_rank": 1,
//    "cache_layout": "<contract wire, 2026-09 form>", ...kvrail's member below}
// snapshot (§2.1; the contract in the snapshot's form):
//   {"role": "Prefill", "world_size": 4, "dp_size": 2, "rank_ip": "10.2.0.1",
//    "rank_port": 18001, "engine_rank": 1, "cache_layout": "<contract wire, snapshot form>",
//    "pp_size": 2, "cache_fields_by_stage": [...],   // kvrail snapshot-era prefills, pp > 1
//    ...kvrail's member below}
// kvrail's own member, in either form:
//    "curve_public_key": "<Z85>"}  // with CURVE on, optional (docs/SECURITY.md)
// Other members are ignored, as the reference ignores them (among them an older kvrail
// prefill's own sharding declaration: the contract's shard_count declares sharding now, §12.8).
//
// The form of a registration is its contract's (Contract::revision). Every stage of a
// pipelined node sends the same wire contract, the whole model's, and the same whole placement
// (§12.3, §12.6); the server relays them in the sync answer (§12.4), where
// control/plan/prefill_description.h reads them.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_REGISTRATION_H_
#define KVRAIL_CONTROL_BOOTSTRAP_REGISTRATION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/layout/revision.h"
#include "control/plan/pipeline.h"

namespace kvrail::bootstrap {

// The role whose registrations the server records (§2.1 step 3); any other role's PUT is
// checked and answered, but enters no table.
inline constexpr absl::string_view kPrefillRole = "Prefill";

// The largest prefill world a registration may declare.
inline constexpr int kMaxWorldSize = 1 << 20;

// Where a prefill rank's control-plane PULL socket listens (§1.1).
struct RankEndpoint {
  std::string rank_ip;
  int rank_port = 0;
  // The rank's CURVE public key (Z85) when it runs with CURVE on: what a decode's PUSH socket
  // to it must name as the server key (docs/SECURITY.md, "Authentication (CURVE)"). Empty
  // otherwise, and then absent from every body, as the reference's are.
  std::string curve_public_key;
};

bool operator==(const RankEndpoint& a, const RankEndpoint& b);
inline bool operator!=(const RankEndpoint& a, const RankEndpoint& b) { return !(a == b); }

struct PrefillRegistration {
  std::string role = std::string(kPrefillRole);
  int world_size = 1;  // every rank of the node: tp * dp (* pp), since cp must be 1 (§2.1, §8)
  int dp_size = 1;
  RankEndpoint endpoint;
  // dp_rank * (world_size / dp_size) + the rank's index within its DP group, where a group's
  // ranks are numbered stage-major when pp_size > 1 (control/plan/pipeline.h).
  int engine_rank = 0;
  // The wire contract (for a pipelined node: the whole model's). Its `revision` is the form
  // the registration is in: SerializeRegistration writes that form, ParseRegistration sets it.
  layout::Contract contract;
  // The stage placement (§12.3). Absent: a snapshot-era registration without one, which means
  // one stage holding every field (SerializeRegistration writes that stage in the 2026-09 form).
  std::optional<plan::PipelineLayout> pipeline;

  // world_size / dp_size: how many ranks one DP group has, across its stages.
  int RanksPerDpGroup() const { return world_size / dp_size; }
  int DpGroup() const { return engine_rank / RanksPerDpGroup(); }
  int RankInDpGroup() const { return engine_rank % RanksPerDpGroup(); }
  int PpSize() const { return pipeline ? pipeline->pp_size : 1; }
};

// A registration the server accepted as well-formed, with its layout's canonical wires (§4.2).
struct ParsedRegistration {
  PrefillRegistration registration;
  // In the registration's own form: what the sync answer relays when it is the first.
  std::string canonical_layout;
  // In the 2026-09 form whatever the registration's: the form the consistency rule of §2.1 and
  // §12.3 step 7 compares byte for byte, so that ranks registering one contract in different
  // forms (a node mid-upgrade) agree. (A snapshot contract the 2026-09 form cannot carry, which
  // no 2026-09 registration can equal: its own canonical wire.)
  std::string comparable_layout;
};

// Reads a PUT /route body. Checks, in the reference's order (§12.3), that the body is a JSON
// object, that role, world_size, dp_size, rank_ip, rank_port and engine_rank are present
// (rank_port and engine_rank as Python's int() reads them: a JSON integer or a string holding
// one), that cache_layout is a string of ASCII that parses as a contract of either form, and
// the stage placement (stage_placement.h: required when the contract is in the 2026-09 form);
// those failures are refusals of kind kReferenceRaises (500). Then kvrail's own rules,
// kBadRequest (400): sizes are positive integers with world_size a multiple of dp_size *
// pp_size, a prefill's engine_rank lies in [0, world_size), rank_port in 1..65535, rank_ip a
// non-empty string without spaces, and curve_public_key, when present, is a Z85 CURVE key.
// Every error names the member and the rule, in one line.
//
// `pinned` (kvrail bootstrap --cachepd-revision): a server that speaks one revision alone
// refuses the other's registrations with 500, as a reference server of that revision does,
// in one line naming the mismatch: pinned to 2026-09, a snapshot-form contract or a body
// without the stage placement (§12.3, §12.11); pinned to the snapshot, a 2026-09-form contract
// (§4.3 step 4: unknown members). Pinned to the snapshot, a placement of more than one stage is
// refused too (400): the snapshot's sync answer cannot describe stages.
absl::StatusOr<ParsedRegistration> ParseRegistration(
    absl::string_view body, std::optional<layout::Revision> pinned = std::nullopt);

// The revision-neutral canonical wire (ParsedRegistration::comparable_layout) of the contract
// `wire` holds, which must be ASCII and parse as a contract of either form (§2.1 step 1); the
// errors are ParseRegistration's for cache_layout.
absl::StatusOr<std::string> CanonicalLayout(absl::string_view wire);

// Writes the PUT /route body for `registration` in the form of registration.contract.revision
// (members in the order above). The 2026-09 form always has pp_size and cache_fields_by_stage
// (one stage holding every field, in plan order, when `pipeline` is unset); the snapshot form
// has them only when `pipeline` is set. Fails when the contract does not serialise in that
// form (§4.2; the snapshot's cannot say shard_count != 1, layout::SerializeContract).
absl::StatusOr<std::string> SerializeRegistration(const PrefillRegistration& registration);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_REGISTRATION_H_
