// The bootstrap server's state (CACHEPD §1.1, §2): the prefill node's sizes, its one canonical
// contract, and the table dp_group -> rank in group -> control endpoint. Thread-safe.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_REGISTRY_H_
#define KVRAIL_CONTROL_BOOTSTRAP_REGISTRY_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "control/bootstrap/registration.h"
#include "control/layout/revision.h"
#include "control/plan/pipeline.h"

namespace kvrail::bootstrap {

// What the sync answer (GET /route with engine_rank=-1 and target_dp_group=-1) describes.
// Every member is unset until the first registration is accepted.
struct NodeDescription {
  std::optional<int> world_size;  // prefill_tp_size: the world, not the TP size (§2.2, §12.4)
  std::optional<int> dp_size;
  // The first accepted registration's canonical wire (§4.2), in that registration's form, and
  // that form: a decode of either revision then reads a layout of the revision its node's
  // prefills speak.
  std::optional<std::string> cache_layout;
  std::optional<layout::Revision> layout_revision;
  // The stage placement: the first accepted registration's, or one stage holding every field
  // in plan order when it had none (§12.4).
  std::optional<plan::PipelineLayout> pipeline;

  // The answer in the form of `revision`:
  //   2026-09 (§12.4): prefill_tp_size, prefill_dp_size, prefill_pp_size (1 while unset),
  //     cache_layout, cache_fields_by_stage (null while unset), in that order;
  //   snapshot (§2.2): prefill_tp_size, prefill_dp_size, cache_layout;
  // sizes and layout null while unset. A snapshot reference decode reads only its three members
  // (§2.3), so the 2026-09 answer serves both.
  nlohmann::ordered_json ToJson(layout::Revision revision = layout::kNewestRevision) const;
};

// What an accepted registration changed, for the server's log.
struct RegistrationOutcome {
  bool recorded = false;  // false when the role is not "Prefill" (§2.1 step 3)
  int dp_group = 0;
  int rank_in_group = 0;
  // The rank had registered a different endpoint, which this one replaced: a restarted rank
  // (CACHEPD §11 item 1 argues for accepting the new route), from the rank's host or with the
  // token.
  std::optional<RankEndpoint> replaced;
  int registered_ranks = 0;  // ranks in the table afterwards
  int world_size = 0;
};

using RouteTable = std::map<int, std::map<int, RankEndpoint>>;

// What the operator fixed before any rank registered (`kvrail bootstrap --world-size --dp-size
// --cache-layout`): a registration that disagrees is refused (kConflict, 409) and changes
// nothing, so a stray first registration cannot set the node's shape and lock every real rank
// out (docs/SECURITY.md). Unset members are fixed by the first accepted registration (§2.1).
struct ConfiguredNode {
  std::optional<int> world_size;
  std::optional<int> dp_size;
  std::optional<std::string> canonical_layout;  // CanonicalLayout()'s (revision-neutral) form
};

// Who sent a registration, for the rule that guards a registered rank's endpoint.
struct Registrant {
  std::string peer_ip;     // the connection's source address (PeerAddress::ip)
  bool has_token = false;  // it carried the bootstrap token (bearer_token.h)
};

class PrefillRegistry {
 public:
  explicit PrefillRegistry(ConfiguredNode configured = {});

  // Records `parsed` (ParseRegistration's result) as §2.1 does, all or nothing:
  //   * its world_size, dp_size and canonical layout must equal the configured ones, if any
  //     (kConflict, 409);
  //   * its stage placement must equal the first accepted registration's, the order inside
  //     each stage included (§12.3 step 6, "incompatible field placement": kReferenceRaises,
  //     500). A registration without a placement means one stage holding every field: it
  //     matches any single-stage placement, and a placement of one stage matches it;
  //   * its canonical layout must equal byte for byte the first accepted registration's, both
  //     in the 2026-09 form (ParsedRegistration::comparable_layout), so one contract
  //     registered in either form agrees ("incompatible layouts", §2.1 step 1, §12.3 step 7:
  //     kReferenceRaises, 500);
  //   * its world_size, dp_size and sharded groups must equal the first registration's
  //     (kConflict, 409; the reference keeps the first silently and files later ranks by
  //     their own sizes);
  //   * a "Prefill" rank is filed under table[engine_rank / (world / dp)][engine_rank % (world
  //     / dp)]. Registering again with the same endpoint changes nothing (§2.1). Another
  //     endpoint replaces the registered one only when `from` comes from the registered
  //     endpoint's own IP (the rank restarting on its host, CACHEPD §11 item 1) or carries the
  //     token; otherwise it is kConflict (409) naming the rank and its registered endpoint, so
  //     that no one else can redirect a rank's decode peers.
  // The first accepted registration of any role stores the sizes, layout and placement.
  absl::StatusOr<RegistrationOutcome> Register(const ParsedRegistration& parsed,
                                               const Registrant& from = {});

  NodeDescription Describe() const;

  // The endpoint of rank `rank_in_group` of DP group `dp_group` (§2.2). An unknown pair is a
  // kReferenceRaises refusal (the reference's KeyError, 500) naming both numbers.
  absl::StatusOr<RankEndpoint> Lookup(int64_t rank_in_group, int64_t dp_group) const;

  RouteTable Table() const;

 private:
  const ConfiguredNode configured_;
  mutable std::mutex mu_;
  NodeDescription node_;           // guarded by mu_
  std::string comparable_layout_;  // guarded by mu_; the first's, in the 2026-09 form
  bool placed_ = false;            // guarded by mu_; the first registration had a placement
  RouteTable table_;               // guarded by mu_
  int registered_ranks_ = 0;       // guarded by mu_
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_REGISTRY_H_
