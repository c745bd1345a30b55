#include "engine/transport/verbs/verbs_probe.h"

#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace kvrail::transport {

namespace {

// The first line of a sysfs file, or "" when it cannot be read.
std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

std::string GidText(const ibv_gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    absl::StrAppend(&out, i == 0 ? "" : ":",
                    absl::StrFormat("%02x%02x", gid.raw[i], gid.raw[i + 1]));
  }
  return out;
}

const char* LinkLayer(uint8_t layer) {
  switch (layer) {
    case IBV_LINK_LAYER_INFINIBAND:
      return "InfiniBand";
    case IBV_LINK_LAYER_ETHERNET:
      return "Ethernet";
    default:
      return "unspecified";
  }
}

int MtuBytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 ? 256 << (mtu - IBV_MTU_256) : 0; }

RdmaDevice ProbeDevice(ibv_device* device, const std::string& sysfs) {
  RdmaDevice out;
  out.name = ibv_get_device_name(device);
  const std::string numa = ReadLine(absl::StrCat(sysfs, "/", out.name, "/device/numa_node"));
  out.numa_node = numa.empty() ? -1 : std::atoi(numa.c_str());
  ibv_context* context = ibv_open_device(device);
  if (context == nullptr) {
    out.error = absl::StrCat("ibv_open_device: ", std::strerror(errno));
    return out;
  }
  ibv_device_attr attr = {};
  if (int rc = ibv_query_device(context, &attr); rc != 0) {
    out.error = absl::StrCat("ibv_query_device: ", std::strerror(rc));
    ibv_close_device(context);
    return out;
  }
  for (int p = 1; p <= attr.phys_port_cnt; ++p) {
    ibv_port_attr port = {};
    if (ibv_query_port(context, p, &port) != 0) continue;
    RdmaPort r;
    r.port = p;
    r.state = ibv_port_state_str(port.state);
    r.active_mtu = MtuBytes(port.active_mtu);
    r.link_layer = LinkLayer(port.link_layer);
    const std::string attrs = absl::StrCat(sysfs, "/", out.name, "/ports/", p, "/gid_attrs/");
    for (int i = 0; i < port.gid_tbl_len; ++i) {
      ibv_gid gid = {};
      if (ibv_query_gid(context, p, i, &gid) != 0) continue;
      static const ibv_gid kZero = {};
      if (std::memcmp(&gid, &kZero, sizeof(gid)) == 0) continue;
      r.gids.push_back({i, GidText(gid), ReadLine(absl::StrCat(attrs, "types/", i)),
                        ReadLine(absl::StrCat(attrs, "ndevs/", i))});
    }
    out.ports.push_back(std::move(r));
  }
  ibv_close_device(context);
  return out;
}

}  // namespace

absl::Status ProbeVerbs(DataPlaneProbe& probe, const std::string& sysfs) {
  probe.dmabuf_mr = dlsym(RTLD_DEFAULT, "ibv_reg_dmabuf_mr") != nullptr;
  int count = 0;
  errno = 0;
  ibv_device** devices = ibv_get_device_list(&count);
  if (devices == nullptr) {
    const int error = errno;
    return absl::UnavailableError(absl::StrCat(
        "libibverbs: ibv_get_device_list returned no list (errno ", error, ", ",
        std::strerror(error),
        error == ENOSYS ? "): this kernel has no RDMA support" : "): no RDMA device is usable"));
  }
  for (int i = 0; i < count; ++i) probe.rdma_devices.push_back(ProbeDevice(devices[i], sysfs));
  ibv_free_device_list(devices);
  return absl::OkStatus();
}

}  // namespace kvrail::transport
