#include "engine/transport/verbs/verbs_rail.h"

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvrail::transport {
namespace {

bool IsIpv4Mapped(const ibv_gid& gid) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, sizeof(kPrefix)) == 0;
}

bool IsZero(const ibv_gid& gid) {
  for (uint8_t byte : gid.raw) {
    if (byte != 0) return false;
  }
  return true;
}

// Whether the network device `ifindex` is up and running in this process's network namespace.
bool NetdevUp(uint32_t ifindex) {
  if (ifindex == 0) return false;
  char name[IF_NAMESIZE] = {};
  if (if_indextoname(ifindex, name) == nullptr) return false;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq request = {};
  std::memcpy(request.ifr_name, name, sizeof(request.ifr_name) - 1);
  const bool up = ioctl(fd, SIOCGIFFLAGS, &request) == 0 &&
                  (request.ifr_flags & (IFF_UP | IFF_RUNNING)) == (IFF_UP | IFF_RUNNING);
  close(fd);
  return up;
}

absl::Status VerbsError(const char* call, int error, const std::string& device) {
  return absl::UnavailableError(
      absl::StrCat(call, " on ", device, ": ", std::strerror(error), " (errno ", error, ")"));
}

const char* GidTypeName(uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
    default:
      return "unknown";
  }
}

}  // namespace

std::string GidText(const ibv_gid& gid) {
  std::string out;
  for (int i = 0; i < 16; i += 2) {
    absl::StrAppend(&out, i == 0 ? "" : ":",
                    absl::StrFormat("%02x%02x", gid.raw[i], gid.raw[i + 1]));
  }
  return out;
}

bool IsLinkLocal(const ibv_gid& gid) { return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80; }

std::string GidIpv4(const ibv_gid& gid) {
  if (!IsIpv4Mapped(gid)) return "";
  return absl::StrFormat("%d.%d.%d.%d", gid.raw[12], gid.raw[13], gid.raw[14], gid.raw[15]);
}

std::optional<uint32_t> ChooseGid(absl::Span<const GidEntry> table, uint8_t link_layer,
                                  int configured) {
  if (configured >= 0) {
    for (const GidEntry& entry : table) {
      if (entry.index == static_cast<uint32_t>(configured) && !IsZero(entry.gid)) {
        return entry.index;
      }
    }
    return std::nullopt;
  }
  if (link_layer == IBV_LINK_LAYER_INFINIBAND) {
    for (const GidEntry& entry : table) {
      if (!IsZero(entry.gid)) return entry.index;
    }
    return std::nullopt;
  }
  for (const GidEntry& entry : table) {
    if (entry.type == IBV_GID_TYPE_ROCE_V2 && IsIpv4Mapped(entry.gid) && !IsLinkLocal(entry.gid) &&
        entry.netdev_up) {
      return entry.index;
    }
  }
  return std::nullopt;
}

int MtuBytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 ? 256 << (mtu - IBV_MTU_256) : 0; }

ibv_mtu MtuFromBytes(uint32_t bytes) {
  ibv_mtu mtu = IBV_MTU_256;
  for (ibv_mtu m : {IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096}) {
    if (static_cast<uint32_t>(MtuBytes(m)) <= bytes) mtu = m;
  }
  return mtu;
}

uint32_t PortGbps(const ibv_port_attr& port) {
  // Per-lane rates of ibv_port_attr::active_speed (IBTA encoding), in units of 0.5 Gb/s so that
  // SDR's 2.5 stays exact.
  uint32_t half_gbps = 0;
  switch (port.active_speed) {
    case 1:
      half_gbps = 5;
      break;  // SDR
    case 2:
      half_gbps = 10;
      break;  // DDR
    case 4:
      half_gbps = 20;
      break;  // QDR
    case 8:
      half_gbps = 20;
      break;  // FDR10
    case 16:
      half_gbps = 28;
      break;  // FDR
    case 32:
      half_gbps = 50;
      break;  // EDR
    case 64:
      half_gbps = 100;
      break;  // HDR
    case 128:
      half_gbps = 200;
      break;  // NDR
    default:
      // XDR does not fit this byte: rdma-core reports it in active_speed_ex, which rdma-core 44
      // has not. Unknown speeds weigh as 1 Gb/s (AssignLanesToRails).
      return 0;
  }
  uint32_t lanes = 0;
  switch (port.active_width) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      return 0;
  }
  return half_gbps * lanes / 2;
}

absl::StatusOr<std::unique_ptr<Rail>> Rail::Open(const VerbsApi& api, ibv_device* device,
                                                 const RailOptions& options) {
  std::unique_ptr<Rail> rail(new Rail(api));
  rail->device_ = api.get_device_name(device);
  rail->port_ = options.port;
  rail->context_ = api.open_device(device);
  if (rail->context_ == nullptr) return VerbsError("ibv_open_device", errno, rail->device_);
  ibv_device_attr device_attr = {};
  if (int rc = api.query_device(rail->context_, &device_attr); rc != 0) {
    return VerbsError("ibv_query_device", rc, rail->device_);
  }
  rail->max_qp_wr_ = static_cast<uint32_t>(device_attr.max_qp_wr);
  rail->max_sge_ = static_cast<uint32_t>(std::max(1, device_attr.max_sge));
  ibv_port_attr port = {};
  if (int rc = api.query_port(rail->context_, options.port, &port); rc != 0) {
    return VerbsError("ibv_query_port", rc, absl::StrCat(rail->device_, " port ", options.port));
  }
  if (port.state != IBV_PORT_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat(rail->device_, " port ", options.port, " is not active (state ",
                     ibv_port_state_str(port.state), "): check its cable and link"));
  }
  rail->lid_ = port.lid;
  rail->mtu_ = port.active_mtu;
  rail->gbps_ = PortGbps(port);
  rail->link_layer_ = port.link_layer;
  std::vector<GidEntry> table;
  for (uint32_t index = 0; index < static_cast<uint32_t>(port.gid_tbl_len); ++index) {
    ibv_gid_entry entry = {};
    if (api.query_gid_ex(rail->context_, options.port, index, &entry, 0) != 0) continue;
    table.push_back({index, entry.gid, entry.gid_type,
                     port.link_layer == IBV_LINK_LAYER_INFINIBAND || NetdevUp(entry.ndev_ifindex)});
  }
  const std::optional<uint32_t> chosen = ChooseGid(table, port.link_layer, options.gid_index);
  if (!chosen) {
    std::vector<std::string> seen;
    for (const GidEntry& entry : table) {
      seen.push_back(absl::StrCat(entry.index, "=", GidText(entry.gid), " (",
                                  GidTypeName(entry.type), entry.netdev_up ? "" : ", netdev down",
                                  ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        rail->device_, " port ", options.port, ": ",
        options.gid_index >= 0 ? absl::StrCat("GID index ", options.gid_index, " is not in use")
                               : "no RoCE v2 IPv4-mapped GID on a network device that is up",
        "; GIDs seen: ", seen.empty() ? "none" : absl::StrJoin(seen, ", "),
        ". Give --gid-index, or bring up the port's network device and give it an IPv4 address"));
  }
  for (const GidEntry& entry : table) {
    if (entry.index == *chosen) rail->gid_ = entry.gid;
  }
  rail->gid_index_ = *chosen;
  rail->pd_ = api.alloc_pd(rail->context_);
  if (rail->pd_ == nullptr) return VerbsError("ibv_alloc_pd", errno, rail->device_);
  return rail;
}

Rail::~Rail() {
  if (pd_ != nullptr) api_.dealloc_pd(pd_);
  if (context_ != nullptr) api_.close_device(context_);
}

absl::StatusOr<std::vector<std::unique_ptr<Rail>>> OpenRails(
    const VerbsApi& api, const std::vector<std::string>& devices, uint8_t port, int gid_index) {
  int count = 0;
  errno = 0;
  ibv_device** list = api.get_device_list(&count);
  if (list == nullptr) {
    const int error = errno;
    return absl::UnavailableError(
        absl::StrCat(api.provider, " lists no RDMA devices: ", std::strerror(error), " (errno ",
                     error, error == ENOSYS ? "; this kernel has no RDMA support" : "", ")"));
  }
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.push_back(api.get_device_name(list[i]));
  std::vector<std::unique_ptr<Rail>> rails;
  absl::Status status;
  std::vector<std::string> refused;
  if (devices.empty()) {
    for (int i = 0; i < count; ++i) {
      auto rail = Rail::Open(api, list[i], {.port = port, .gid_index = gid_index});
      if (rail.ok()) {
        rails.push_back(*std::move(rail));
      } else {
        refused.push_back(std::string(rail.status().message()));
      }
    }
    if (rails.empty()) {
      status = absl::FailedPreconditionError(
          absl::StrCat(api.provider, ": no usable RDMA device",
                       count == 0 ? " (the device list is empty)"
                                  : absl::StrCat(": ", absl::StrJoin(refused, "; "))));
    }
  } else {
    for (const std::string& name : devices) {
      int found = -1;
      for (int i = 0; i < count; ++i) {
        if (names[i] == name) found = i;
      }
      if (found < 0) {
        status = absl::NotFoundError(
            absl::StrCat("RDMA device \"", name, "\" not found; ", api.provider, " lists ",
                         names.empty() ? "none" : absl::StrJoin(names, ", ")));
        break;
      }
      auto rail = Rail::Open(api, list[found], {.port = port, .gid_index = gid_index});
      if (!rail.ok()) {
        status = rail.status();
        break;
      }
      rails.push_back(*std::move(rail));
    }
  }
  api.free_device_list(list);
  if (!status.ok()) return status;
  return rails;
}

}  // namespace kvrail::transport
