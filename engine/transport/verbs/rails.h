// Multi-rail planning for the verbs backend: which RDMA NICs ("rails") a memory arena should
// use, how a transfer's bytes are split across them, and when a failed rail is tried again.
//
// Everything here is pure: the topology comes from a sysfs tree whose root the caller names (so
// tests read a fixture, testdata/sysfs_8gpu_8nic), and time is passed in. No sockets, threads or
// clocks, so every decision can be replayed in a unit test.
//
// The affinity rules follow what NCCL does on the same hardware: a GPU's traffic goes through
// the NIC that shares its PCIe switch (NCCL's PIX/PXB), because GPUDirect RDMA through the CPU's
// root complex is slower, or not supported at all, on many platforms; host memory goes through
// the NICs on its own NUMA node, because crossing the socket link costs bandwidth and latency.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_RAILS_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_RAILS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvrail::transport {

// One PCI function as sysfs shows it: an RDMA device or a GPU.
struct PciDevice {
  // "mlx5_0" for an RDMA device; the PCI address ("0000:18:00.0") for a GPU.
  std::string name;
  // Domain:bus:device.function, e.g. "0000:1a:00.0". Empty when unknown.
  std::string pci_address;
  // From sysfs; -1 when unknown (sysfs says -1 on single-node machines and in some VMs).
  int numa_node = -1;
  // The directories from the root complex down to the device itself, as sysfs nests them, e.g.
  // {"pci0000:17", "0000:17:00.0", "0000:18:00.0"}. Empty when unknown (a host arena, or a NIC
  // known only by name).
  std::vector<std::string> pci_path;
};

// The RDMA devices under `<sysfs_root>/class/infiniband`, sorted by name (numbers in names
// compare as numbers: mlx5_2 before mlx5_10). Each one's `device` link is resolved to its PCI
// function under `<sysfs_root>/devices`, and its NUMA node is read from `device/numa_node`.
// A device without a PCI function (software RoCE and iWARP devices have no `device` link, or
// one that leads outside `devices/pci*`) is listed with an empty pci_path and numa_node -1:
// unknown topology, not an error, so that one such device does not hide the others.
//
// Fails naming the path and the reason (NotFound, PermissionDenied, ...) when the
// infiniband class cannot be listed (no RDMA driver loaded, or a wrong root), or when a link
// or file that exists cannot be read.
absl::StatusOr<std::vector<PciDevice>> ReadRdmaDevices(const std::string& sysfs_root);

// The NVIDIA GPUs under `<sysfs_root>/bus/pci/devices`: vendor 0x10de with class 0x030200 (3D
// controller, the data-centre parts) or 0x030000 (VGA). Other NVIDIA functions, such as
// NVSwitches and the GPUs' audio functions, are left out. Sorted by PCI address, which is the
// order CUDA enumerates them in with CUDA_DEVICE_ORDER=PCI_BUS_ID. Fails naming the path when
// `<sysfs_root>/bus/pci/devices` cannot be listed, or a device's files cannot be read.
absl::StatusOr<std::vector<PciDevice>> ReadGpus(const std::string& sysfs_root);

// How far apart two PCI functions are. PciDistance returns a number that grows with the tier
// and, within the tier, with the hops: PIX/PXB (a shared PCIe switch) < PHB (the same root
// complex) < NODE (the same NUMA node) < SYS (across sockets, or where it cannot be told).
inline constexpr int kPciSameRootComplex = 100;
inline constexpr int kPciSameNuma = 200;
inline constexpr int kPciCrossSocket = 300;

// The PCIe distance between `a` and `b`. When they share a bridge below the root complex (a
// switch port or a root port), it is the number of links from each up to the closest common
// bridge, added together: 4 for a GPU and a NIC on two ports of one switch. Otherwise it is the
// tier constant above plus the links from each up to its root complex. A device without a
// pci_path (host memory described only by its NUMA node) is kPciSameNuma from devices on its
// node and kPciCrossSocket from the rest, with no hops added: the CPU reaches every root port
// on its socket alike. Unknown NUMA nodes count as across sockets, the pessimistic guess.
int PciDistance(const PciDevice& a, const PciDevice& b);

// Indices into `nics`, best first for traffic to or from `gpu_or_cpu`: by PciDistance, then
// NICs on the device's NUMA node before the others, then by name, then by index. A CPU is a
// PciDevice with only numa_node set.
std::vector<int> RankRailsForDevice(const PciDevice& gpu_or_cpu,
                                    const std::vector<PciDevice>& nics);

// Where an arena's memory lives.
struct ArenaLocation {
  // Set for GPU memory: the GPU, as ReadGpus found it.
  std::optional<PciDevice> gpu;
  // For host memory: the NUMA node its pages are on; -1 when unknown.
  int numa_node = -1;
};

// The rails an arena should use, as indices into `nics`:
//  - GPU memory: the NICs at the smallest PciDistance from the GPU (normally the one on its
//    switch), ties by name. A GPU's traffic through a farther NIC crosses the root complex or
//    the socket link, which is slower than that NIC's wire, so the far NICs are better left out
//    than striped across.
//  - Host memory on NUMA node n: every NIC on node n, by name.
//  - Unknown topology (a GPU without a PCI path, host memory on no known node, no NIC with a
//    PCI path or node, or no NIC on the arena's node): every rail, in the order given, so that
//    the caller still works, only without the placement.
std::vector<int> ChooseRail(const ArenaLocation& arena, const std::vector<PciDevice>& nics);

// The RDMA devices an arena named by `affinity` should use, best first, read from the sysfs tree
// at `sysfs_root` (ReadRdmaDevices, ReadGpus, ChooseRail): "gpu:<PCI address>" (a GPU arena:
// the NICs nearest that GPU) or "numa:<node>" (host memory on that node: the NICs on it).
// InvalidArgument naming the rule for any other text, NotFound naming the GPUs seen for a GPU
// sysfs does not show; the readers' errors when the tree cannot be read.
absl::StatusOr<std::vector<std::string>> RailsForAffinity(const std::string& sysfs_root,
                                                          absl::string_view affinity);

// The rate in whole Gb/s from a sysfs `ports/<n>/rate` line: "400 Gb/sec (4X NDR)" -> 400,
// "100 Gb/sec (4X EDR)" -> 100, "2.5 Gb/sec (1X SDR)" -> 2 (rounded down). 0 for anything
// that does not start with a positive number followed by " Gb/sec".
int ParseRateGbps(absl::string_view sysfs_rate_line);

// Which rails are in rotation, given the failures and successes the data path reports.
//
// A rail starts in rotation. A failure takes it out for a backoff, probe_after at first. When
// the backoff has passed, TakeProbe hands the rail to exactly one caller, which sends one
// transfer over it and reports the outcome: success puts the rail back in rotation (and resets
// its backoff); failure takes it out again with the backoff doubled, up to 16 x probe_after.
// Until then no other caller gets the rail, so a dead link costs one transfer per backoff and
// not one per caller. The prober must report an outcome: a probe that is never reported keeps
// the rail out of rotation.
//
// Reports that arrive while a rail is out and not being probed are late completions of work
// posted before the failure; they change nothing (a late success proves nothing about the link
// now, and a late failure is the same outage, not a new one).
//
// Time is passed in, never read, so tests control it. Rails outside [0, rails) are ignored by
// the reports and are never in rotation.
//
// Not thread-safe: the caller holds its own lock around every call.
class RailHealth {
 public:
  RailHealth(int rails, absl::Duration probe_after);

  void ReportFailure(int rail, absl::Time now);
  void ReportSuccess(int rail, absl::Time now);

  // Whether `rail` is in rotation. A rail being probed is not: only its prober uses it.
  bool InRotation(int rail, absl::Time now) const;

  // The lowest-numbered rail whose backoff has passed and which nobody is probing, now
  // marked as being probed by the caller; nullopt when there is none.
  std::optional<int> TakeProbe(absl::Time now);

  // The rails in rotation, in index order.
  std::vector<int> Up(absl::Time now) const;

  // How long `rail` stays out after its latest failure (0 while in rotation). For tests and
  // for `kvrail doctor`-style reports.
  absl::Duration Backoff(int rail) const;

 private:
  enum class State { kUp, kOut, kProbing };
  struct Rail {
    State state = State::kUp;
    absl::Duration backoff = absl::ZeroDuration();
    absl::Time probe_at = absl::InfinitePast();
  };

  bool Valid(int rail) const;

  absl::Duration probe_after_;
  std::vector<Rail> rails_;
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_RAILS_H_
