// What the data plane can use on this host, for `kvrail doctor`: UCX's transport resources and
// the RDMA devices libibverbs sees, with their ports and GIDs. Backend-neutral values; each
// backend fills its part (ucx/ucx_probe.h, verbs/verbs_probe.h) and ProbeDataPlane asks them
// all. Nothing is connected, registered or sent.
#ifndef KVRAIL_ENGINE_TRANSPORT_PROBE_H_
#define KVRAIL_ENGINE_TRANSPORT_PROBE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvrail::transport {

// One UCX transport resource: "tcp" on "eth0", "posix" on "memory", "rc_mlx5" on "mlx5_0:1".
struct TransportResource {
  std::string component;  // uct component ("tcp", "posix", "ib", "cuda_cpy", ...)
  std::string md;         // its memory domain
  std::string transport;  // tl name
  std::string device;
  std::string kind;  // "network", "shared memory", "accelerator", "self", "other"
};

struct RdmaGid {
  int index = 0;
  std::string gid;     // "fe80:0000:...", as sysfs writes it
  std::string type;    // "RoCE v2", "IB/RoCE v1", or "" where sysfs does not say
  std::string netdev;  // the network device a RoCE GID belongs to, or ""
};

struct RdmaPort {
  int port = 0;
  std::string state;          // "active", "down", ...
  int active_mtu = 0;         // bytes
  std::string link_layer;     // "InfiniBand", "Ethernet"
  std::vector<RdmaGid> gids;  // the non-zero ones
};

struct RdmaDevice {
  std::string name;    // "mlx5_0"
  int numa_node = -1;  // from sysfs; -1 when unknown
  std::vector<RdmaPort> ports;
  std::string error;  // why the device could not be opened or queried, or ""
};

struct DataPlaneProbe {
  // UCX: OK, or why its resources could not be listed.
  absl::Status ucx_status;
  std::string ucx_version;
  std::vector<TransportResource> ucx_resources;
  std::vector<std::string> ucx_problems;  // memory domains that could not be opened
  // libibverbs: OK (devices may still be none), or why no device list came back.
  absl::Status rdma_status;
  std::vector<RdmaDevice> rdma_devices;
  bool dmabuf_mr = false;  // this libibverbs offers ibv_reg_dmabuf_mr (GPU memory by dmabuf)

  // Whether a UCX resource's transport is one of `names`.
  bool UcxHas(const std::vector<std::string>& names) const;
};

DataPlaneProbe ProbeDataPlane();

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_PROBE_H_
