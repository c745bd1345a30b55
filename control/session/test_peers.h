// Test support: the contracts and manifests of prefill_scenarios.json's fan-out scenario
// (P = 2, D = 4: prefill rank 0 serves decode ranks 0 and 1, rank 1 serves 2 and 3), and frame
// builders for registrations, pre-allocations and status messages.
#ifndef KVRAIL_CONTROL_SESSION_TEST_PEERS_H_
#define KVRAIL_CONTROL_SESSION_TEST_PEERS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/revision.h"

namespace kvrail::session::testing {

// The prefill contract of the fan-out scenario (P = 2).
const layout::Contract& PrefillContract();
// The decode contract its registrations carry (D = 4), and its canonical wire.
const layout::Contract& DecodeContract();
const std::string& DecodeContractWire();
// The decode manifest its pre-allocations carry, and the matching source manifest.
const layout::Manifest& DecodeManifest();
const std::string& DecodeManifestWire();
const layout::Manifest& SourceManifest();

// Decode rank d of the scenario: endpoint "10.1.0.<d+1>", reply port 17000+d, session
// "10.1.0.<d+1>:<15000+d>", arena base 0x7e0000000000.
std::string SessionOf(int decode_rank);
std::string ReplyEndpointOf(int decode_rank);  // "tcp://10.1.0.<d+1>:<17000+d>"

// The 8 registration frames of decode rank d (of D = 4) with the scenario's decode contract;
// `port` and `arena_base` override the defaults when set.
std::vector<std::string> RegistrationFrames(int decode_rank, std::optional<uint16_t> port = {},
                                            std::optional<uint64_t> arena_base = {});
// The same registration with the decode contract written in `form` (CACHEPD §12.1): the
// scenario's own wire is the snapshot's.
std::vector<std::string> RegistrationFramesInForm(int decode_rank, layout::Revision form);
// The 3 pre-allocation frames of `room` from `session_id` with `manifest_wire`.
std::vector<std::string> PreallocationFrames(uint64_t room, const std::string& session_id,
                                             const std::string& manifest_wire);
// The 5 status frames (CACHEPD §3.4).
std::vector<std::string> StatusFrames(uint64_t room, int status, int prefill_rank,
                                      int64_t token = -1,
                                      std::optional<std::vector<int32_t>> spec_ids = {});
// The 7 status frames of the 2026-09 revision (CACHEPD §12.9): a Success or Failed with the
// cached-token count and the bootstrap logprob (nullopt = none), no token and no ids.
std::vector<std::string> StatusFrames2026_09(uint64_t room, int status, int prefill_rank,
                                             int64_t cached_tokens,
                                             std::optional<double> bootstrap_logprob);

}  // namespace kvrail::session::testing

#endif  // KVRAIL_CONTROL_SESSION_TEST_PEERS_H_
