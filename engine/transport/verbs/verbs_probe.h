// libibverbs' part of the data-plane probe (engine/transport/probe.h): the RDMA devices this host
// has, their ports (state, MTU, link layer), the non-zero GIDs of each port with their type and
// network device (from sysfs, as rdma-core's `show_gids` reads them), each device's NUMA node,
// and whether this libibverbs offers dmabuf registration (GPU memory without nvidia-peermem).
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_PROBE_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "engine/transport/probe.h"

namespace kvrail::transport {

// Fills `probe`'s rdma_devices and dmabuf_mr. Unavailable, naming errno, when libibverbs returns
// no device list at all (on a kernel without RDMA support: ENOSYS); OK with no device when the
// list is empty. A device that cannot be opened or queried is listed with its error.
// `sysfs` is where the infiniband class lives ("/sys/class/infiniband"; tests give a recorded
// tree).
absl::Status ProbeVerbs(DataPlaneProbe& probe, const std::string& sysfs = "/sys/class/infiniband");

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_PROBE_H_
