// Multi-rail planning for the verbs backend (rails.h): sysfs topology, rail choice, striping and
// rail health. Pure code apart from reading the sysfs tree the caller names.
#include "engine/transport/verbs/rails.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvrail::transport {
namespace {

constexpr absl::string_view kNvidiaVendor = "0x10de";
constexpr absl::string_view kClass3dController = "0x030200";
constexpr absl::string_view kClassVga = "0x030000";

absl::Status ErrnoError(int error, absl::string_view what, const std::string& path) {
  return absl::Status(
      absl::ErrnoToStatusCode(error),
      absl::StrCat(what, " ", path, ": ", std::strerror(error), " (errno ", error, ")"));
}

// The entries of directory `dir`, without "." and "..", sorted so that results do not depend on
// the order the filesystem returns them in.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> listing(opendir(dir.c_str()), closedir);
  if (listing == nullptr) return ErrnoError(errno, "cannot list", dir);
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* entry = readdir(listing.get())) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  if (errno != 0) return ErrnoError(errno, "cannot list", dir);
  std::sort(names.begin(), names.end());
  return names;
}

// The canonical path of `path` (every symlink resolved, as sysfs' relative links need), or
// nullopt with `error` set to errno.
std::optional<std::string> RealPath(const std::string& path, int& error) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    error = errno;
    return std::nullopt;
  }
  return std::string(resolved);
}

// The contents of a one-line sysfs attribute, without surrounding whitespace. NotFound when the
// file does not exist, so that callers can treat an absent attribute as unknown.
absl::StatusOr<std::string> ReadAttribute(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot read", path);
  // sysfs attributes are at most a page long.
  char buffer[4096];
  ssize_t n;
  do {
    n = read(fd, buffer, sizeof(buffer));
  } while (n < 0 && errno == EINTR);
  const int error = errno;
  close(fd);
  if (n < 0) return ErrnoError(error, "cannot read", path);
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buffer, n)));
}

// The NUMA node in `<device_dir>/numa_node`; -1 when the file is absent or does not hold a
// node number (sysfs writes -1 itself on single-node machines).
absl::StatusOr<int> ReadNumaNode(const std::string& device_dir) {
  absl::StatusOr<std::string> text = ReadAttribute(device_dir + "/numa_node");
  if (absl::IsNotFound(text.status())) return -1;
  if (!text.ok()) return text.status();
  int node = -1;
  if (!absl::SimpleAtoi(*text, &node) || node < 0) return -1;
  return node;
}

// Fills `device`'s pci_path and pci_address from the canonical path of its PCI function, when
// that lies under `<canonical_root>/devices/pci*`. Anything else (a virtual device) leaves the
// topology unknown.
void SetPciPath(const std::string& canonical_root, const std::string& function_path,
                PciDevice& device) {
  const std::string prefix = canonical_root + "/devices/";
  if (function_path.compare(0, prefix.size(), prefix) != 0) return;
  std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(function_path).substr(prefix.size()), '/');
  if (parts.size() < 2 || !absl::StartsWith(parts.front(), "pci")) return;
  device.pci_address = parts.back();
  device.pci_path = std::move(parts);
}

// Compares names with runs of digits taken as numbers, so that mlx5_2 sorts before mlx5_10 as
// ibv_devices and NCCL list them.
bool NaturalLess(absl::string_view a, absl::string_view b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (absl::ascii_isdigit(a[i]) && absl::ascii_isdigit(b[j])) {
      size_t i_end = i;
      size_t j_end = j;
      while (i_end < a.size() && absl::ascii_isdigit(a[i_end])) ++i_end;
      while (j_end < b.size() && absl::ascii_isdigit(b[j_end])) ++j_end;
      // Leading zeros do not change a number's value: compare without them, shorter first.
      absl::string_view x = a.substr(i, i_end - i);
      absl::string_view y = b.substr(j, j_end - j);
      while (x.size() > 1 && x.front() == '0') x.remove_prefix(1);
      while (y.size() > 1 && y.front() == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

bool SameKnownNuma(const PciDevice& a, const PciDevice& b) {
  return a.numa_node >= 0 && a.numa_node == b.numa_node;
}

// Whether anything is known about where `device` is.
bool HasTopology(const PciDevice& device) {
  return !device.pci_path.empty() || device.numa_node >= 0;
}

std::vector<int> AllInOrder(size_t count) {
  std::vector<int> all(count);
  for (size_t i = 0; i < count; ++i) all[i] = static_cast<int>(i);
  return all;
}

}  // namespace

absl::StatusOr<std::vector<PciDevice>> ReadRdmaDevices(const std::string& sysfs_root) {
  const std::string class_dir = sysfs_root + "/class/infiniband";
  absl::StatusOr<std::vector<std::string>> names = ListDir(class_dir);
  if (!names.ok()) return names.status();
  int error = 0;
  // The root is resolved too, so that pci paths come out right when it is itself a link (a
  // test's runfiles, or /sys reached through a bind mount).
  const std::optional<std::string> root = RealPath(sysfs_root, error);
  if (!root) return ErrnoError(error, "cannot resolve", sysfs_root);

  std::vector<PciDevice> devices;
  for (const std::string& name : *names) {
    PciDevice device;
    device.name = name;
    const std::string link = absl::StrCat(class_dir, "/", name, "/device");
    const std::optional<std::string> function = RealPath(link, error);
    if (!function) {
      // Software RoCE and iWARP devices have no PCI function of their own.
      if (error == ENOENT) {
        devices.push_back(std::move(device));
        continue;
      }
      return ErrnoError(error, "cannot resolve", link);
    }
    SetPciPath(*root, *function, device);
    absl::StatusOr<int> numa = ReadNumaNode(link);
    if (!numa.ok()) return numa.status();
    device.numa_node = *numa;
    devices.push_back(std::move(device));
  }
  std::sort(devices.begin(), devices.end(),
            [](const PciDevice& a, const PciDevice& b) { return NaturalLess(a.name, b.name); });
  return devices;
}

absl::StatusOr<std::vector<PciDevice>> ReadGpus(const std::string& sysfs_root) {
  const std::string bus_dir = sysfs_root + "/bus/pci/devices";
  absl::StatusOr<std::vector<std::string>> addresses = ListDir(bus_dir);
  if (!addresses.ok()) return addresses.status();
  int error = 0;
  const std::optional<std::string> root = RealPath(sysfs_root, error);
  if (!root) return ErrnoError(error, "cannot resolve", sysfs_root);

  std::vector<PciDevice> gpus;
  for (const std::string& address : *addresses) {
    const std::string entry = absl::StrCat(bus_dir, "/", address);
    absl::StatusOr<std::string> vendor = ReadAttribute(entry + "/vendor");
    if (!vendor.ok()) return vendor.status();
    if (absl::AsciiStrToLower(*vendor) != kNvidiaVendor) continue;
    absl::StatusOr<std::string> pci_class = ReadAttribute(entry + "/class");
    if (!pci_class.ok()) return pci_class.status();
    const std::string lower_class = absl::AsciiStrToLower(*pci_class);
    if (lower_class != kClass3dController && lower_class != kClassVga) continue;

    PciDevice gpu;
    gpu.name = address;
    gpu.pci_address = address;
    const std::optional<std::string> function = RealPath(entry, error);
    if (!function) return ErrnoError(error, "cannot resolve", entry);
    SetPciPath(*root, *function, gpu);
    absl::StatusOr<int> numa = ReadNumaNode(entry);
    if (!numa.ok()) return numa.status();
    gpu.numa_node = *numa;
    gpus.push_back(std::move(gpu));
  }
  return gpus;  // ListDir sorted the addresses.
}

int PciDistance(const PciDevice& a, const PciDevice& b) {
  const int tier = SameKnownNuma(a, b) ? kPciSameNuma : kPciCrossSocket;
  if (a.pci_path.empty() || b.pci_path.empty()) return tier;

  size_t common = 0;
  while (common < a.pci_path.size() && common < b.pci_path.size() &&
         a.pci_path[common] == b.pci_path[common]) {
    ++common;
  }
  // Hops are capped below the tier stride so that a deep hierarchy can never rank a farther
  // tier ahead of a nearer one.
  auto capped = [](size_t hops) { return static_cast<int>(std::min<size_t>(hops, 99)); };
  // pci_path[0] is the root complex, so sharing two entries means sharing a root port or a
  // switch port below it: traffic between them never reaches the host bridge.
  if (common >= 2) return capped(a.pci_path.size() - common + b.pci_path.size() - common);
  const int hops = capped(a.pci_path.size() - 1 + b.pci_path.size() - 1);
  if (common == 1) return kPciSameRootComplex + hops;
  return tier + hops;
}

std::vector<int> RankRailsForDevice(const PciDevice& gpu_or_cpu,
                                    const std::vector<PciDevice>& nics) {
  std::vector<int> order = AllInOrder(nics.size());
  std::vector<int> distance(nics.size());
  for (size_t i = 0; i < nics.size(); ++i) distance[i] = PciDistance(gpu_or_cpu, nics[i]);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    if (distance[x] != distance[y]) return distance[x] < distance[y];
    const bool x_local = SameKnownNuma(gpu_or_cpu, nics[x]);
    const bool y_local = SameKnownNuma(gpu_or_cpu, nics[y]);
    if (x_local != y_local) return x_local;
    if (nics[x].name != nics[y].name) return NaturalLess(nics[x].name, nics[y].name);
    return x < y;
  });
  return order;
}

std::vector<int> ChooseRail(const ArenaLocation& arena, const std::vector<PciDevice>& nics) {
  if (std::none_of(nics.begin(), nics.end(), HasTopology)) return AllInOrder(nics.size());

  std::vector<int> chosen;
  if (arena.gpu.has_value()) {
    if (!HasTopology(*arena.gpu)) return AllInOrder(nics.size());
    const std::vector<int> ranked = RankRailsForDevice(*arena.gpu, nics);
    const int best = PciDistance(*arena.gpu, nics[ranked.front()]);
    for (int i : ranked) {
      if (PciDistance(*arena.gpu, nics[i]) == best) chosen.push_back(i);
    }
  } else {
    if (arena.numa_node < 0) return AllInOrder(nics.size());
    for (size_t i = 0; i < nics.size(); ++i) {
      if (nics[i].numa_node == arena.numa_node) chosen.push_back(static_cast<int>(i));
    }
  }
  if (chosen.empty()) return AllInOrder(nics.size());
  std::stable_sort(chosen.begin(), chosen.end(),
                   [&](int x, int y) { return NaturalLess(nics[x].name, nics[y].name); });
  return chosen;
}

absl::StatusOr<std::vector<std::string>> RailsForAffinity(const std::string& sysfs_root,
                                                          absl::string_view affinity) {
  ArenaLocation arena;
  absl::string_view value = affinity;
  if (absl::ConsumePrefix(&value, "gpu:")) {
    absl::StatusOr<std::vector<PciDevice>> gpus = ReadGpus(sysfs_root);
    if (!gpus.ok()) return gpus.status();
    std::vector<std::string> seen;
    for (const PciDevice& gpu : *gpus) {
      if (gpu.pci_address == value) arena.gpu = gpu;
      seen.push_back(gpu.pci_address);
    }
    if (!arena.gpu) {
      return absl::NotFoundError(absl::StrCat("rail affinity \"", affinity, "\": sysfs at ",
                                              sysfs_root, " shows no GPU ", value, "; it shows ",
                                              seen.empty() ? "none" : absl::StrJoin(seen, ", ")));
    }
  } else if (absl::ConsumePrefix(&value, "numa:")) {
    if (!absl::SimpleAtoi(value, &arena.numa_node) || arena.numa_node < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rail affinity \"", affinity, "\": a NUMA node is a number >= 0"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "rail affinity \"", affinity,
        "\": expected gpu:<PCI address> (\"gpu:0000:18:00.0\") or numa:<node> (\"numa:1\")"));
  }
  absl::StatusOr<std::vector<PciDevice>> nics = ReadRdmaDevices(sysfs_root);
  if (!nics.ok()) return nics.status();
  std::vector<std::string> names;
  for (int i : ChooseRail(arena, *nics)) names.push_back((*nics)[i].name);
  return names;
}

int ParseRateGbps(absl::string_view sysfs_rate_line) {
  absl::string_view line = absl::StripAsciiWhitespace(sysfs_rate_line);
  size_t end = 0;
  while (end < line.size() && (absl::ascii_isdigit(line[end]) || line[end] == '.')) ++end;
  if (end == 0 || !absl::StartsWith(line.substr(end), " Gb/sec")) return 0;
  double gbps = 0;
  if (!absl::SimpleAtod(line.substr(0, end), &gbps) || !(gbps > 0)) return 0;
  if (gbps >= static_cast<double>(INT_MAX)) return 0;
  return static_cast<int>(std::floor(gbps));
}

RailHealth::RailHealth(int rails, absl::Duration probe_after)
    : probe_after_(std::max(probe_after, absl::ZeroDuration())),
      rails_(static_cast<size_t>(std::max(rails, 0))) {}

bool RailHealth::Valid(int rail) const {
  return rail >= 0 && static_cast<size_t>(rail) < rails_.size();
}

void RailHealth::ReportFailure(int rail, absl::Time now) {
  if (!Valid(rail)) return;
  Rail& r = rails_[rail];
  switch (r.state) {
    case State::kUp:
      r.backoff = probe_after_;
      break;
    case State::kProbing:
      // The link is still bad after a whole backoff: wait longer before costing another
      // transfer, but never so long that a repaired link stays unused for more than 16 backoffs.
      r.backoff = std::min(r.backoff * 2, probe_after_ * 16);
      break;
    case State::kOut:
      return;  // A late completion of the same outage.
  }
  r.state = State::kOut;
  r.probe_at = now + r.backoff;
}

void RailHealth::ReportSuccess(int rail, absl::Time now) {
  if (!Valid(rail)) return;
  Rail& r = rails_[rail];
  // Only the probe's outcome counts: a success reported while the rail is out is a transfer
  // posted before the failure, and says nothing about the link now.
  if (r.state != State::kProbing) return;
  r.state = State::kUp;
  r.backoff = absl::ZeroDuration();
  r.probe_at = absl::InfinitePast();
}

bool RailHealth::InRotation(int rail, absl::Time now) const {
  // `now` does not matter today: a rail comes back only through a successful probe, never by
  // time alone. It is part of the signature so that a time-based policy needs no caller changes.
  return Valid(rail) && rails_[rail].state == State::kUp;
}

std::optional<int> RailHealth::TakeProbe(absl::Time now) {
  for (size_t i = 0; i < rails_.size(); ++i) {
    Rail& r = rails_[i];
    if (r.state == State::kOut && now >= r.probe_at) {
      r.state = State::kProbing;
      return static_cast<int>(i);
    }
  }
  return std::nullopt;
}

std::vector<int> RailHealth::Up(absl::Time now) const {
  std::vector<int> up;
  for (size_t i = 0; i < rails_.size(); ++i) {
    if (InRotation(static_cast<int>(i), now)) up.push_back(static_cast<int>(i));
  }
  return up;
}

absl::Duration RailHealth::Backoff(int rail) const {
  if (!Valid(rail) || rails_[rail].state == State::kUp) return absl::ZeroDuration();
  return rails_[rail].backoff;
}

}  // namespace kvrail::transport
