// The UCX backend's context (ucx_transport.h): its options checked, UCX's configuration written
// (TLS, devices, tcp segments, keepalive, peer-failure handling over shared memory), ucp_init,
// and what follows from the transports UCX may load: wherever tcp may carry writes they go as
// kvrail's active messages (ucx_transport.h, "Writes over tcp"), of at most one tcp segment.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_CONTEXT_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_CONTEXT_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/transport/ucx/ucx_options.h"

namespace kvrail::transport::ucx_internal {

// UCX's text for a status.
std::string Ucs(ucs_status_t status);
// OK for UCS_OK; Cancelled for UCS_ERR_CANCELED; else Unavailable: "<context>: UCX: <status>".
absl::Status FromUcs(ucs_status_t status, const std::string& context);

// InvalidArgument naming the option for lanes < 1, max_write_bytes == 0, a tcp tx segment
// outside [1 KiB, 16 MiB], an rx segment smaller than the tx one, a negative keepalive interval
// or a connect timeout that is not positive.
absl::Status CheckOptions(const UcxOptions& options);

struct Context {
  ucp_context_h context = nullptr;  // the caller's to ucp_cleanup
  // Writes go as active messages of at most am_slice_bytes (tcp may carry them); else puts.
  bool am_writes = false;
  uint64_t am_slice_bytes = 0;
};

// UCX's context for `options` (checked). InvalidArgument when UCX rejects the tls or
// net_devices given; Unavailable with UCX's status when it cannot configure or initialise.
absl::StatusOr<Context> CreateContext(const UcxOptions& options);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_CONTEXT_H_
