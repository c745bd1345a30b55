#include "engine/transport/probe.h"

#include <algorithm>

#include "engine/transport/ucx/ucx_probe.h"
#include "engine/transport/verbs/verbs_probe.h"

namespace kvrail::transport {

bool DataPlaneProbe::UcxHas(const std::vector<std::string>& names) const {
  return std::any_of(ucx_resources.begin(), ucx_resources.end(), [&](const TransportResource& r) {
    return std::find(names.begin(), names.end(), r.transport) != names.end();
  });
}

DataPlaneProbe ProbeDataPlane() {
  DataPlaneProbe probe;
  probe.ucx_status = ProbeUcx(probe);
  probe.rdma_status = ProbeVerbs(probe);
  return probe;
}

}  // namespace kvrail::transport
