#include "tools/doctor.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "control/bootstrap/client.h"
#include "engine/memory/cuda_arena.h"
#include "engine/transport/handshake/handshake.h"
#include "nlohmann/json.hpp"

namespace kvrail::tools {

namespace {

using Level = Finding::Level;

std::string ReadLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// NVIDIA devices of class display (0x03xxxx: GPUs and 3D controllers) on the PCI bus.
std::vector<PciDevice> NvidiaGpus(const std::string& sysfs) {
  std::vector<PciDevice> out;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(sysfs + "/bus/pci/devices", error)) {
    if (ReadLine(entry.path() / "vendor") != "0x10de") continue;
    if (!absl::StartsWith(ReadLine(entry.path() / "class"), "0x03")) continue;
    int numa = -1;
    if (!absl::SimpleAtoi(ReadLine(entry.path() / "numa_node"), &numa)) numa = -1;
    out.push_back({entry.path().filename().string(), "NVIDIA GPU", numa});
  }
  std::sort(out.begin(), out.end(),
            [](const PciDevice& a, const PciDevice& b) { return a.address < b.address; });
  return out;
}

std::vector<std::string> HostAddresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    out.push_back(absl::StrCat(text, " (", a->ifa_name, ")"));
  }
  freeifaddrs(list);
  return out;
}

// OK when a socket can bind `host` here: it is one of this host's addresses.
absl::Status CanBind(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", host, "\" does not resolve: ", gai_strerror(rc)));
  }
  absl::Status status = absl::UnavailableError("no address");
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      status = absl::OkStatus();
    } else {
      status = absl::FailedPreconditionError(absl::StrCat("\"", host, "\" cannot be bound here (",
                                                          std::strerror(errno),
                                                          "): it is not an address of this host"));
    }
    close(fd);
    if (status.ok()) break;
  }
  freeaddrinfo(found);
  return status;
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kOk:
      return "ok";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kFail:
      return "FAIL";
  }
  return "?";
}

// The UCX transports that reach remote memory over an RDMA NIC, and GPU memory.
const std::vector<std::string> kUcxRdma = {"rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5"};
const std::vector<std::string> kUcxCuda = {"cuda_copy", "cuda_ipc", "gdr_copy"};

void DiagnoseUcx(const transport::DataPlaneProbe& p, std::vector<Finding>& out) {
  if (!p.ucx_status.ok()) {
    out.push_back({Level::kFail, "ucx", std::string(p.ucx_status.message()),
                   "install UCX (Debian: libucx0 ucx-utils) and check `ucx_info -d`"});
    return;
  }
  std::set<std::string> transports;
  for (const transport::TransportResource& r : p.ucx_resources) transports.insert(r.transport);
  out.push_back(
      {Level::kOk, "ucx",
       absl::StrCat("UCX ", p.ucx_version, ", transports: ", absl::StrJoin(transports, " ")), ""});
  const bool tcp = transports.count("tcp") > 0;
  const bool shm = transports.count("posix") > 0 || transports.count("sysv") > 0;
  if (!p.UcxHas(kUcxRdma)) {
    out.push_back({Level::kWarn, "ucx",
                   absl::StrCat("no RDMA transport in UCX: writes go over ",
                                tcp && shm ? "tcp, and shared memory between sidecars of one host"
                                : tcp      ? "tcp"
                                           : "shared memory only"),
                   "for RDMA: a NIC with its rdma-core provider, and a UCX built with verbs "
                   "(`ucx_info -d | grep rc_`)"});
  }
  if (!tcp) {
    out.push_back({Level::kWarn, "ucx",
                   "UCX has no tcp transport: no sidecar on another host "
                   "can be reached without RDMA",
                   "check UCX_TLS and UCX_NET_DEVICES in the environment"});
  }
  if (!p.UcxHas(kUcxCuda)) {
    out.push_back({Level::kInfo, "ucx",
                   "UCX has no CUDA transport (cuda_copy, cuda_ipc, gdr_copy): GPU arenas are "
                   "staged through host memory over UCX",
                   ""});
  }
  for (const std::string& problem : p.ucx_problems) {
    out.push_back({Level::kInfo, "ucx", absl::StrCat("memory domain skipped: ", problem), ""});
  }
}

void DiagnoseRdma(const transport::DataPlaneProbe& p, std::vector<Finding>& out) {
  if (!p.rdma_status.ok() || p.rdma_devices.empty()) {
    out.push_back({Level::kWarn, "rdma",
                   p.rdma_status.ok() ? "libibverbs lists no RDMA device"
                                      : std::string(p.rdma_status.message()),
                   "kvrail runs over UCX's tcp and shared memory here, and `--backend verbs` "
                   "only over the software provider (KVRAIL_VERBS_PROVIDER=softverbs, for tests, "
                   "never hardware); for RDMA, a NIC, its kernel driver and rdma-core's provider "
                   "(`ibv_devices` lists it)"});
    return;
  }
  for (const transport::RdmaDevice& d : p.rdma_devices) {
    if (!d.error.empty()) {
      out.push_back({Level::kFail, "rdma", absl::StrCat(d.name, ": ", d.error),
                     "check the device's permissions (/dev/infiniband) and its driver"});
      continue;
    }
    for (const transport::RdmaPort& port : d.ports) {
      const std::string where = absl::StrCat(d.name, " port ", port.port);
      bool roce_v2 = false;
      std::vector<std::string> gids;
      for (const transport::RdmaGid& g : port.gids) {
        roce_v2 |= absl::StrContains(g.type, "v2");
        gids.push_back(absl::StrCat(g.index, "=", g.gid, g.type.empty() ? "" : " " + g.type,
                                    g.netdev.empty() ? "" : " " + g.netdev));
      }
      const Level level = port.state == "PORT_ACTIVE" ? Level::kOk : Level::kWarn;
      out.push_back(
          {level, "rdma",
           absl::StrCat(where, ": ", port.state, ", ", port.link_layer, ", MTU ", port.active_mtu,
                        ", NUMA node ", d.numa_node, ", GIDs ",
                        gids.empty() ? "none" : absl::StrJoin(gids, "; ")),
           level == Level::kOk ? "" : "bring the link up (cable, switch port, `ip link`)"});
      if (port.link_layer == "Ethernet" && !roce_v2) {
        out.push_back({Level::kWarn, "rdma", absl::StrCat(where, ": no RoCE v2 GID"),
                       "give the port's netdev an IPv4 address so that a RoCE v2 GID appears"});
      }
      if (port.link_layer == "Ethernet" && port.active_mtu > 0 && port.active_mtu < 4096) {
        out.push_back({Level::kInfo, "rdma",
                       absl::StrCat(where, ": path MTU ", port.active_mtu, " bytes"),
                       "a netdev MTU of 9000 gives RoCE 4096-byte packets"});
      }
    }
  }
  out.push_back({Level::kInfo, "rdma",
                 p.dmabuf_mr ? "libibverbs offers ibv_reg_dmabuf_mr (GPU memory by dmabuf)"
                             : "libibverbs has no ibv_reg_dmabuf_mr: GPU memory needs "
                               "nvidia-peermem",
                 ""});
}

void DiagnoseGpu(const DoctorFacts& f, std::vector<Finding>& out) {
  if (f.cuda.ok()) {
    out.push_back(
        {Level::kOk, "gpu",
         absl::StrCat("CUDA sees a GPU; ", f.gpus.size(), " NVIDIA device(s) on the PCI bus"), ""});
  } else {
    out.push_back(
        {f.gpus.empty() ? Level::kWarn : Level::kFail, "gpu",
         absl::StrCat(f.cuda.message(), f.gpus.empty() ? "; no NVIDIA device on the PCI bus"
                                                       : absl::StrCat("; but ", f.gpus.size(),
                                                                      " NVIDIA device(s) on the "
                                                                      "PCI bus")),
         f.gpus.empty() ? "host arenas only; GPU arenas need a GPU and its driver"
                        : "install or load the NVIDIA driver matching this CUDA"});
  }
  // Placement: a GPU's arena is best written by a NIC on its NUMA node.
  std::set<int> nic_nodes;
  for (const transport::RdmaDevice& d : f.data_plane.rdma_devices) nic_nodes.insert(d.numa_node);
  for (const PciDevice& gpu : f.gpus) {
    const bool near = nic_nodes.count(gpu.numa_node) > 0;
    out.push_back({near || nic_nodes.empty() ? Level::kInfo : Level::kWarn, "placement",
                   absl::StrCat(gpu.what, " ", gpu.address, " on NUMA node ", gpu.numa_node,
                                nic_nodes.empty() ? ", no RDMA NIC"
                                : near            ? ", with an RDMA NIC on the same node"
                                                  : ", no RDMA NIC on its node"),
                   near || nic_nodes.empty() ? "" : "expect lower bandwidth across the socket"});
  }
}

}  // namespace

DoctorFacts Gather(const DoctorOptions& options) {
  DoctorFacts f;
  f.data_plane = transport::ProbeDataPlane();
  f.cuda = CudaAvailable();
  f.gpus = NvidiaGpus(options.sysfs);
  f.host_addresses = HostAddresses();
  f.advertise_host = options.advertise_host;
  if (!f.advertise_host.empty()) f.advertise = CanBind(f.advertise_host);
  const auto timeout = std::chrono::milliseconds(static_cast<int>(options.timeout_seconds * 1e3));
  f.bootstrap = options.bootstrap;
  if (!f.bootstrap.empty()) {
    const size_t colon = f.bootstrap.rfind(':');
    int port = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(f.bootstrap.substr(colon + 1), &port)) {
      f.bootstrap_health = absl::InvalidArgumentError(
          absl::StrCat("--bootstrap \"", f.bootstrap, "\": expected <host>:<port>"));
    } else {
      bootstrap::BootstrapClientOptions client;
      client.connect_timeout = client.read_timeout = client.deadline = timeout;
      client.retries = 0;
      f.bootstrap_health =
          bootstrap::BootstrapClient(f.bootstrap.substr(0, colon), port, client).Health();
    }
  }
  f.peer = options.peer;
  if (!f.peer.empty()) {
    absl::StatusOr<v1::HandshakeDescriptor> d =
        transport::FetchDescriptor(f.peer, absl::FromChrono(timeout));
    f.peer_handshake = d.status();
    if (d.ok()) f.peer_transport = v1::TransportKind_Name(d->transport());
  }
  return f;
}

std::vector<Finding> Diagnose(const DoctorFacts& f) {
  std::vector<Finding> out;
  DiagnoseUcx(f.data_plane, out);
  DiagnoseRdma(f.data_plane, out);
  DiagnoseGpu(f, out);
  if (!f.advertise_host.empty()) {
    if (f.advertise.ok()) {
      const bool loopback = absl::StartsWith(f.advertise_host, "127.") ||
                            f.advertise_host == "localhost" || f.advertise_host == "::1";
      out.push_back({loopback ? Level::kWarn : Level::kOk, "advertise",
                     absl::StrCat(f.advertise_host, " is an address of this host"),
                     loopback ? "a loopback address reaches only sidecars on this host: give "
                                "--host an address the peers can route to"
                              : ""});
    } else {
      out.push_back({Level::kFail, "advertise", std::string(f.advertise.message()),
                     absl::StrCat("give --host one of this host's addresses (",
                                  absl::StrJoin(f.host_addresses, ", "),
                                  "); in a container, the address the peers reach it at must be "
                                  "the container's own (host networking), or none of them can "
                                  "write to it")});
    }
  }
  if (!f.bootstrap.empty()) {
    out.push_back({f.bootstrap_health.ok() ? Level::kOk : Level::kFail, "bootstrap",
                   f.bootstrap_health.ok() ? absl::StrCat(f.bootstrap, " answers /health")
                                           : std::string(f.bootstrap_health.message()),
                   f.bootstrap_health.ok()
                       ? ""
                       : "start `kvrail bootstrap` there, or fix --bootstrap (host:port)"});
  }
  if (!f.peer.empty()) {
    out.push_back(
        {f.peer_handshake.ok() ? Level::kOk : Level::kFail, "peer",
         f.peer_handshake.ok()
             ? absl::StrCat(f.peer, " serves its descriptor (", f.peer_transport, ")")
             : std::string(f.peer_handshake.message()),
         f.peer_handshake.ok()
             ? ""
             : "check that the decode sidecar runs and that its --host is reachable from here"});
  }
  return out;
}

bool AnyFailed(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(),
                     [](const Finding& f) { return f.level == Level::kFail; });
}

std::string FormatText(const std::vector<Finding>& findings) {
  std::string out;
  int problems = 0;
  for (const Finding& f : findings) {
    absl::StrAppend(&out,
                    absl::StrFormat("%-5s %-10s %s\n", LevelName(f.level), f.check, f.detail));
    if (!f.fix.empty()) absl::StrAppend(&out, "      -> ", f.fix, "\n");
    problems += f.level == Level::kWarn || f.level == Level::kFail;
  }
  absl::StrAppend(
      &out, AnyFailed(findings) ? "kvrail doctor: problems found (" : "kvrail doctor: ready (",
      problems, " warning(s) or failure(s))\n");
  return out;
}

std::string FormatJson(const DoctorFacts& facts, const std::vector<Finding>& findings) {
  nlohmann::json out;
  out["ok"] = !AnyFailed(findings);
  out["findings"] = nlohmann::json::array();
  for (const Finding& f : findings) {
    out["findings"].push_back(
        {{"level", LevelName(f.level)}, {"check", f.check}, {"detail", f.detail}, {"fix", f.fix}});
  }
  nlohmann::json& ucx = out["facts"]["ucx"];
  ucx["version"] = facts.data_plane.ucx_version;
  ucx["resources"] = nlohmann::json::array();
  for (const transport::TransportResource& r : facts.data_plane.ucx_resources) {
    ucx["resources"].push_back({{"component", r.component},
                                {"md", r.md},
                                {"transport", r.transport},
                                {"device", r.device},
                                {"kind", r.kind}});
  }
  nlohmann::json& rdma = out["facts"]["rdma"];
  rdma["status"] = facts.data_plane.rdma_status.ToString();
  rdma["dmabuf_mr"] = facts.data_plane.dmabuf_mr;
  rdma["devices"] = nlohmann::json::array();
  for (const transport::RdmaDevice& d : facts.data_plane.rdma_devices) {
    nlohmann::json device = {{"name", d.name}, {"numa_node", d.numa_node}, {"error", d.error}};
    device["ports"] = nlohmann::json::array();
    for (const transport::RdmaPort& p : d.ports) {
      nlohmann::json port = {{"port", p.port},
                             {"state", p.state},
                             {"active_mtu", p.active_mtu},
                             {"link_layer", p.link_layer}};
      port["gids"] = nlohmann::json::array();
      for (const transport::RdmaGid& g : p.gids) {
        port["gids"].push_back(
            {{"index", g.index}, {"gid", g.gid}, {"type", g.type}, {"netdev", g.netdev}});
      }
      device["ports"].push_back(port);
    }
    rdma["devices"].push_back(device);
  }
  out["facts"]["cuda"] = facts.cuda.ToString();
  out["facts"]["gpus"] = nlohmann::json::array();
  for (const PciDevice& g : facts.gpus) {
    out["facts"]["gpus"].push_back({{"address", g.address}, {"numa_node", g.numa_node}});
  }
  out["facts"]["host_addresses"] = facts.host_addresses;
  return out.dump(2) + "\n";
}

}  // namespace kvrail::tools
