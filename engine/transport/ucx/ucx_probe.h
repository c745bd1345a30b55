// UCX's part of the data-plane probe (engine/transport/probe.h): the library's version and every
// transport resource (transport and device) its components report, as `ucx_info -d` lists them.
// Asks UCX's transport layer (uct) directly: no context, worker or endpoint is made.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PROBE_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PROBE_H_

#include "absl/status/status.h"
#include "engine/transport/probe.h"

namespace kvrail::transport {

// Fills `probe`'s ucx_version, ucx_resources and ucx_problems (a memory domain that cannot be
// opened is a problem, and the rest are still listed). Internal, naming the uct call and its
// status, when UCX cannot list its components.
absl::Status ProbeUcx(DataPlaneProbe& probe);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PROBE_H_
