// Makes the data plane a process asks for by name. Only engine/transport names a backend
// (docs/ARCHITECTURE.md, "Layers"): the sidecar, the tools and the tests above it describe what
// they want in a TransportSpec and hold the result as a Transport.
#ifndef KVRAIL_ENGINE_TRANSPORT_FACTORY_H_
#define KVRAIL_ENGINE_TRANSPORT_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/transport/transport.h"

namespace kvrail::transport {

struct TransportSpec {
  // One of KnownBackends(): "ucx" (the real data plane) or "loopback" (in-process memcpy, for
  // tests).
  std::string backend = "ucx";
  // Independent queues of writes (UCX: one worker each).
  int lanes = 2;
  // UCX only: the transport layers that carry the bytes. "sm" is shared memory on this host
  // (UCX's "sm,self"); anything else ("tcp", "tcp,sm", ...) goes to UCX's TLS setting as given;
  // empty keeps UCX's default (or the UCX_TLS environment variable).
  std::string tls;
  // UCX only: the network interface for tcp ("lo", "eth0"); empty keeps UCX's default. Not
  // used with tls "sm", which crosses no network device.
  std::string net_devices;
  // The largest single write, and the advice on bytes in flight per peer (Capabilities);
  // 0 keeps the backend's default.
  uint64_t max_write_bytes = 0;
  uint64_t max_inflight_bytes_per_endpoint = 0;
  // UCX only: the longest Connect waits for a peer's wireup; zero keeps the backend's default.
  absl::Duration connect_timeout = absl::ZeroDuration();
};

// The backends MakeTransport knows, sorted: {"loopback", "ucx"}.
std::vector<std::string> KnownBackends();

// A started transport of `spec.backend`. InvalidArgument for an unknown backend (naming the
// known ones) or for UCX-only settings given to loopback; otherwise the backend's own errors
// (lanes < 1, a tls UCX rejects, Unavailable when UCX cannot start).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const TransportSpec& spec);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_FACTORY_H_
