// A client of a CachePD bootstrap server (CACHEPD §2), kvrail's or the reference's.
//
// Prefill ranks register with it (PUT /route, §1.2); decode ranks read the node description
// and each target rank's control endpoint (GET /route, §1.3 D2 and D4) and send heartbeats
// (GET /health, §1.6). Every error names the server address, the request, and what was wrong:
// the transport error, or the HTTP status with an excerpt of the body.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_CLIENT_H_
#define KVRAIL_CONTROL_BOOTSTRAP_CLIENT_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "control/bootstrap/registration.h"
#include "control/layout/revision.h"
#include "control/plan/prefill_description.h"

namespace kvrail::bootstrap {

struct BootstrapClientOptions {
  // Per attempt; the defaults are the reference heartbeat's (§1.6).
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds read_timeout{3000};
  // Further attempts after a transport failure (refused, reset, timed out).
  int retries = 3;
  // Wait before the first retry; doubles after each, up to max_backoff.
  std::chrono::milliseconds backoff{100};
  std::chrono::milliseconds max_backoff{1000};
  // One call's whole budget: every attempt, every wait, and the time spent waiting for a node
  // that is not ready yet. No call returns much later than this.
  std::chrono::milliseconds deadline{10000};
  // When not empty, PUT /route carries "Authorization: Bearer <token>" (bearer_token.h), which a
  // server started with that token requires (docs/SECURITY.md). GETs never carry it. Empty: nothing
  // changes on the wire.
  std::string bearer_token;
  // The CachePD revision a prefill registers in (the sidecar's --cachepd-revision). nullopt
  // (auto, the default): the server's, learnt from its sync answer (ServerRevision). Pinned:
  // that revision's form, whatever the server speaks.
  std::optional<layout::Revision> cachepd_revision;
};

// A header kvrail's bootstrap server adds to its GET /route answers (bodies stay the
// reference's, byte for byte): its node's prefill ranks are kvrail sidecars, which prove their
// statuses to kvrail decodes (docs/SECURITY.md, "Success only from the real sender").
inline constexpr char kKvrailNodeHeader[] = "X-Kvrail-Node";

class BootstrapClient {
 public:
  BootstrapClient(std::string host, int port, BootstrapClientOptions options = {});

  // "host:port", as errors name the server.
  std::string address() const;

  // Registers `registration` (PUT /route) in the form of the server's revision: first it reads
  // the sync answer (ServerRevision) unless options.cachepd_revision pins the form, then it
  // PUTs the body in that form (SerializeRegistration with contract.revision set to it): for
  // 2026-09, pp_size and cache_fields_by_stage always and the contract in the 2026-09 form
  // (§12.3); for the snapshot, the snapshot's body and contract (§2.1). With the bearer token
  // when one is set. OK on 200, and then `*registered_form` (optional) is the form used, for
  // the caller to log once. Both requests share the call's deadline, and their transport
  // failures are retried (a server still starting).
  // Failures: FailedPrecondition, without a PUT, for a contract the server's revision cannot
  // express (shard_count != 1 against a snapshot server), naming the revision mismatch. The
  // server's verdict fails at once: FailedPrecondition for 409 (disagrees with the node's first
  // registration or configuration, or the rank is registered at another endpoint),
  // Unauthenticated for 401 (the token is missing or wrong), InvalidArgument otherwise (the
  // reference answers 500 to every refusal; a sync answer that is not a JSON object too).
  absl::Status RegisterPrefillRank(const PrefillRegistration& registration,
                                   layout::Revision* registered_form = nullptr) const;

  // The revision the server speaks, from one sync answer (GET /route?engine_rank=-1&
  // target_dp_group=-1), which it does not wait to be filled: a member cache_fields_by_stage,
  // even null, says 2026-09 (§12.4); without it, the snapshot (§2.2). Transport failures are
  // retried; a non-200 answer or a body that is not a JSON object fails at once.
  absl::StatusOr<layout::Revision> ServerRevision() const;

  // GET /route?engine_rank=-1&target_dp_group=-1 (§2.2), parsed with ParsePrefillDescription
  // (§2.3, §10.2). An answer with null sizes or layout means no prefill rank has registered
  // yet: it is asked again, with backoff, until the deadline (then DeadlineExceeded). A
  // non-200 answer or a description that does not parse fails at once.
  // `kvrail_node` (optional) says whether the server is kvrail's (the answer carries
  // kKvrailNodeHeader): its prefill ranks prove their statuses (control/wire/proof.h).
  absl::StatusOr<plan::PrefillDescription> Sync(bool* kvrail_node = nullptr) const;

  // GET /route?engine_rank=<rank_in_group>&target_dp_group=<dp_group> (§1.3 D4): the control
  // endpoint of that prefill rank. A 500 is what both servers answer for a rank that has not
  // registered (§2.2), so it is asked again until the deadline; other refusals and a body
  // that is not {"rank_ip": string, "rank_port": 1..65535} fail at once.
  absl::StatusOr<RankEndpoint> LookupRank(int rank_in_group, int dp_group) const;

  // GET /health, one attempt (§1.6: the caller counts consecutive failures). OK on 200.
  absl::Status Health() const;

 private:
  struct Answer {
    int status = 0;
    std::string body;
    bool kvrail_node = false;  // the answer carried kKvrailNodeHeader
  };
  // Returns why `answer` means "ask again later", or nullopt when it is final.
  using NotReady = std::function<std::optional<std::string>(const Answer&)>;

  using Clock = std::chrono::steady_clock;

  // One request, its transport failures retried and its not-ready answers asked again, until
  // `deadline` (default: options.deadline from now).
  absl::StatusOr<Answer> Call(const std::string& method, const std::string& target,
                              const std::string& body, int retries, const NotReady& not_ready,
                              std::optional<Clock::time_point> deadline = std::nullopt) const;
  absl::StatusOr<layout::Revision> ServerRevisionBy(Clock::time_point deadline) const;
  absl::Status Refused(const std::string& method, const std::string& target,
                       const Answer& answer) const;

  std::string host_;
  int port_;
  BootstrapClientOptions options_;
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_CLIENT_H_
