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
#include "engine/transport/landing_copy.h"
#include "engine/transport/transport.h"

namespace kvrail::transport {

struct TransportSpec {
  // One of KnownBackends(): "ucx" (the default data plane), "verbs" (raw libibverbs RC writes)
  // or "loopback" (in-process memcpy, for tests).
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
  // UCX: the longest Connect waits for a peer's wireup; verbs: for the peer's queue-pair
  // exchange. Zero keeps the backend's default.
  absl::Duration connect_timeout = absl::ZeroDuration();
  // Verbs only: who answers the verbs calls. "libibverbs" (rdma-core: real RDMA devices) or
  // "softverbs" (the software provider: RC writes between processes on this host through shared
  // memory, for tests and demos, never hardware and never bandwidth). Empty: the environment
  // variable KVRAIL_VERBS_PROVIDER, else "libibverbs".
  std::string verbs_provider;
  // Verbs only: the RDMA devices to use as rails, in order (lane i on rail i % rails); empty:
  // every device with an active port. And a GID index for every rail (-1: chosen, see
  // engine/transport/verbs/verbs_rail.h).
  std::vector<std::string> rdma_devices;
  int gid_index = -1;
  // Verbs only, when rdma_devices is empty: the arena the rails should be near,
  // "gpu:<PCI address>" or "numa:<node>" (engine/transport/verbs/rails.h, RailsForAffinity).
  std::string rail_affinity;
  // UCX only: how the lanes' own copies store into landing memory: auto (streaming for rows that
  // land or are read apart, plain for the rest), plain (memcpy) or streaming (non-temporal)
  // stores; which is faster depends on the host (engine/transport/landing_copy.h).
  LandingStores landing_stores = LandingStores::kAuto;
  // What this side calls itself as a writer, so that a peer may refuse its connections once it
  // finds it gone (Transport::RefuseWriter): a sidecar's CachePD endpoint ("tcp://host:port",
  // as the peers' rooms name it). UCX sends it where tcp may carry the writes, verbs with
  // each connect request; loopback ignores it. Empty: unnamed.
  std::string writer_name;
};

// The backends MakeTransport knows, sorted: {"loopback", "ucx", "verbs"}.
std::vector<std::string> KnownBackends();

// A started transport of `spec.backend`. InvalidArgument for an unknown backend (naming the
// known ones) or for UCX-only settings given to loopback; otherwise the backend's own errors
// (lanes < 1, a tls UCX rejects, Unavailable when UCX cannot start).
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(const TransportSpec& spec);

// The verbs provider `spec` selects (see TransportSpec::verbs_provider): "libibverbs" or
// "softverbs". InvalidArgument for any other name.
absl::StatusOr<std::string> VerbsProviderOf(const TransportSpec& spec);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_FACTORY_H_
