// The verbs backend's queue pairs (verbs_transport.h): an RC QP created and driven RESET -> INIT
// -> RTR -> RTS through the verbs seam (verbs_api.h), and destroyed after the error state (the
// fence); the errors of verbs calls and of work completions as one line each.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_QP_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_QP_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/transport/verbs/verbs_api.h"
#include "engine/transport/verbs/verbs_rail.h"
#include "proto/kvrail/v1/verbs.pb.h"

namespace kvrail::transport::verbs_internal {

// Unavailable: "<call> (<where>): <strerror> (errno <error>)".
absl::Status VerbsCallError(const char* call, int error, absl::string_view where);

// A random 24-bit packet sequence number.
uint32_t RandomPsn();

// The text of a work completion's status, as rdma-core names it, and what it usually means.
std::string WcStatusText(ibv_wc_status status);

// An RC QP on `rail` completing into `cq`, at most `max_send_wr` work requests outstanding of
// at most `max_send_sge` scatter-gather entries each, in INIT (remote writes allowed). The verbs
// call's error, naming `where`, when one fails.
absl::StatusOr<ibv_qp*> CreateQp(const VerbsApi& api, const Rail& rail, ibv_cq* cq,
                                 uint32_t max_send_wr, uint32_t max_send_sge,
                                 const std::string& where);
// INIT -> RTR towards `remote` at path MTU `mtu`.
absl::Status QpToRtr(const VerbsApi& api, ibv_qp* qp, const Rail& rail,
                     const v1::VerbsQpInfo& remote, ibv_mtu mtu);
// RTR -> RTS with send PSN `psn` and the RC retry budget (verbs_transport.h, VerbsOptions).
absl::Status QpToRts(const VerbsApi& api, ibv_qp* qp, uint32_t psn, uint8_t timeout,
                     uint8_t retry_cnt);
// To the error state, then destroyed. Nothing for null.
void DestroyQp(const VerbsApi& api, ibv_qp* qp);

}  // namespace kvrail::transport::verbs_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_QP_H_
