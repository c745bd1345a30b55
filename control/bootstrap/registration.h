// A prefill rank's registration with the bootstrap server: the JSON body of `PUT /route`
// (CACHEPD §2.1), read by the server and written by the client.
//
//   {"role": "Prefill", "world_size": 4, "dp_size": 2, "rank_ip": "10.2.0.1",
//    "rank_port": 18001, "engine_rank": 1, "cache_layout": "<contract wire>",
//    "pp_size": 2,                                   // optional, default 1 (§10.1, §10.2)
//    "cache_fields_by_stage": [["layer.0.k"], ...],  // optional; required when pp_size > 1
//    "cache_sharded_groups": [{"group_id": "history", "owners": 2}],  // kvrail, optional
//    "curve_public_key": "<Z85>"}  // kvrail with CURVE on, optional (docs/SECURITY.md)
//
// A Python prefill sends only the first seven members. The pipeline members follow the
// reference's later bootstrap (every rank of every stage sends the same wire contract and the
// same whole placement); the server relays them in the sync answer (§10.2), where
// control/plan/prefill_description.h reads them.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_REGISTRATION_H_
#define KVRAIL_CONTROL_BOOTSTRAP_REGISTRATION_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "control/layout/contract.h"
#include "control/plan/owner_filter.h"
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
  layout::Contract contract;  // the wire contract (for a pipelined node: the whole model's)
  // The kvrail / Rust extensions (§10.1–§10.3). Absent: the rank is a Python prefill's, one
  // stage holding every field and no block-sharded group.
  std::optional<plan::PipelineLayout> pipeline;
  std::vector<plan::ShardedGroup> sharded_groups;

  // world_size / dp_size: how many ranks one DP group has, across its stages.
  int RanksPerDpGroup() const { return world_size / dp_size; }
  int DpGroup() const { return engine_rank / RanksPerDpGroup(); }
  int RankInDpGroup() const { return engine_rank % RanksPerDpGroup(); }
  int PpSize() const { return pipeline ? pipeline->pp_size : 1; }
};

// A registration the server accepted as well-formed, with its layout's canonical wire (§4.2):
// the form the consistency rule of §2.1 compares byte for byte.
struct ParsedRegistration {
  PrefillRegistration registration;
  std::string canonical_layout;
};

// Reads a PUT /route body. Checks, in the reference's order, that the body is a JSON object,
// that role, world_size, dp_size, rank_ip, rank_port and engine_rank are present (rank_port and
// engine_rank as Python's int() reads them: a JSON integer or a string holding one), and that
// cache_layout is a string of ASCII that parses as a contract; those failures are refusals of
// kind kReferenceRaises (500). Then kvrail's own rules, kBadRequest (400): sizes are positive
// integers with world_size a multiple of dp_size * pp_size, a prefill's engine_rank lies in
// [0, world_size), rank_port in 1..65535, rank_ip a non-empty string without spaces, the
// pipeline and sharding members are well-formed and fit the contract, and curve_public_key,
// when present, is a Z85 CURVE key. Every error names the
// member and the rule, in one line.
absl::StatusOr<ParsedRegistration> ParseRegistration(absl::string_view body);

// The canonical wire (§4.2) of the contract `wire` holds, which must be ASCII and parse as a
// contract (§2.1 step 1); the errors are ParseRegistration's for cache_layout.
absl::StatusOr<std::string> CanonicalLayout(absl::string_view wire);

// Writes the PUT /route body for `registration` (members in the order above; the pipeline
// members only when set). Fails when the contract does not serialise (§4.2).
absl::StatusOr<std::string> SerializeRegistration(const PrefillRegistration& registration);

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_REGISTRATION_H_
