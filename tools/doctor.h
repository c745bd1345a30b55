// `kvrail doctor`: a preflight report to run before deploying a sidecar. It gathers facts (what
// UCX and libibverbs offer, CUDA, where NICs and GPUs sit, whether the address a sidecar would
// advertise is this host's, whether a bootstrap server and a peer's handshake endpoint answer)
// and turns them into findings: each a check, what was seen, and for every problem one line
// saying what to change. Diagnose is pure (facts in, findings out) so that tests feed it facts
// from hosts that are not this one; Gather asks this host.
#ifndef KVRAIL_TOOLS_DOCTOR_H_
#define KVRAIL_TOOLS_DOCTOR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/transport/probe.h"

namespace kvrail::tools {

struct PciDevice {
  std::string address;  // "0000:17:00.0"
  std::string what;     // "NVIDIA GPU"
  int numa_node = -1;
};

struct DoctorOptions {
  std::string advertise_host;  // the --host a sidecar would get; "" to skip
  std::string bootstrap;       // host:port of a bootstrap server; "" to skip
  std::string peer;            // a decode sidecar's session id (its handshake ip:port); "" to skip
  double timeout_seconds = 2;  // for the bootstrap and the peer
  std::string sysfs = "/sys";  // tests give a recorded tree
};

struct DoctorFacts {
  transport::DataPlaneProbe data_plane;
  absl::Status cuda;            // CudaAvailable()
  std::vector<PciDevice> gpus;  // NVIDIA devices on the PCI bus (sysfs), GPU or not visible
  // The advertised host: empty when not asked; else OK when this host can bind it, or why not.
  std::string advertise_host;
  absl::Status advertise;
  std::vector<std::string> host_addresses;  // this host's IPv4 addresses, up or not
  std::string bootstrap;
  absl::Status bootstrap_health;
  std::string peer;
  absl::Status peer_handshake;
  std::string peer_transport;  // the transport the peer's descriptor names, when it answered
};

struct Finding {
  enum class Level { kOk, kInfo, kWarn, kFail };
  Level level = Level::kOk;
  std::string check;   // "ucx", "rdma", "gpu", "placement", "advertise", "bootstrap", "peer"
  std::string detail;  // what was seen
  std::string fix;     // what to change; empty when nothing needs to
};

// Asks this host (UCX, libibverbs, CUDA, sysfs, sockets, the named bootstrap and peer).
DoctorFacts Gather(const DoctorOptions& options);

// The findings, in the order of the checks above. kFail only for what stops a sidecar from
// working as configured (an advertised address that is not this host's, a bootstrap or peer
// that does not answer, UCX unusable); a missing RDMA device or GPU is kWarn (kvrail runs over
// tcp and shared memory, and says so).
std::vector<Finding> Diagnose(const DoctorFacts& facts);

// One line per finding ("ok    ucx        UCX 1.13.1: ..."), each fix on the next line after
// "  -> ", then a summary line.
std::string FormatText(const std::vector<Finding>& findings);
// {"findings": [{"level", "check", "detail", "fix"}], "ok": bool, "facts": {...}}
std::string FormatJson(const DoctorFacts& facts, const std::vector<Finding>& findings);

// Whether any finding is kFail.
bool AnyFailed(const std::vector<Finding>& findings);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_DOCTOR_H_
