#include "engine/transport/verbs/softverbs/rails.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "engine/sync/mutex.h"

namespace kvrail::transport::softverbs {

std::vector<Rail> ParseRails(const std::string& spec) {
  std::vector<Rail> rails;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0 || eq + 1 == item.size()) continue;
    Rail rail;
    rail.device = item.substr(0, eq);
    std::string netdev = item.substr(eq + 1);
    const size_t colon = netdev.find(':');
    if (colon != std::string::npos) {
      const int gbps = std::atoi(netdev.c_str() + colon + 1);
      netdev.resize(colon);
      if (gbps <= 0 || netdev.empty()) continue;
      rail.gbps = gbps;
    }
    rail.netdev = netdev;
    rails.push_back(rail);
  }
  return rails;
}

namespace rails {
namespace {

struct LinkCache {
  kvrail::Mutex mu;
  std::map<std::string, std::pair<bool, absl::Time>> state ABSL_GUARDED_BY(mu);
};

bool QueryNetdevUp(const std::string& netdev) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ifreq req;
  std::memset(&req, 0, sizeof(req));
  std::strncpy(req.ifr_name, netdev.c_str(), IFNAMSIZ - 1);
  const bool ok = ioctl(fd, SIOCGIFFLAGS, &req) == 0;
  close(fd);
  return ok && (req.ifr_flags & IFF_UP) && (req.ifr_flags & IFF_RUNNING);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

bool NetdevUp(const std::string& netdev) {
  static LinkCache* cache = new LinkCache;
  const absl::Time now = absl::Now();
  {
    kvrail::MutexLock lock(&cache->mu);
    auto it = cache->state.find(netdev);
    if (it != cache->state.end() && now - it->second.second < absl::Milliseconds(10)) {
      return it->second.first;
    }
  }
  const bool up = QueryNetdevUp(netdev);
  kvrail::MutexLock lock(&cache->mu);
  cache->state[netdev] = {up, now};
  return up;
}

ibv_gid LinkLocalGid(const Rail& rail) {
  ibv_gid gid;
  std::memset(&gid, 0, sizeof(gid));
  gid.raw[0] = 0xfe;
  gid.raw[1] = 0x80;
  uint64_t id = Fnv1a(rail.device + "@" + rail.netdev);
  for (int i = 15; i >= 8; --i, id >>= 8) gid.raw[i] = static_cast<uint8_t>(id);
  gid.raw[8] &= 0xfd;  // Clear the universal/local bit as an EUI-64 of a local MAC would.
  return gid;
}

std::optional<ibv_gid> Ipv4Gid(const Rail& rail) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return std::nullopt;
  std::optional<ibv_gid> result;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (rail.netdev != a->ifa_name) continue;
    ibv_gid gid;
    std::memset(&gid, 0, sizeof(gid));
    gid.raw[10] = 0xff;
    gid.raw[11] = 0xff;
    const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    std::memcpy(&gid.raw[12], &sin->sin_addr, 4);
    result = gid;
    break;
  }
  freeifaddrs(list);
  return result;
}

void SpeedFor(int gbps, uint8_t* width, uint8_t* speed) {
  // Per-lane rates in tenths of Gb/s with their ibv_port_attr::active_speed codes.
  static constexpr struct {
    int tenths;
    uint8_t code;
  } kSpeeds[] = {{25, 1}, {50, 2}, {100, 4}, {140, 16}, {250, 32}, {500, 64}, {1000, 128}};
  // ibv_port_attr::active_width codes (libibverbs has no names for them): 1 = 1X, 2 = 4X.
  const int lanes = gbps <= 25 ? 1 : 4;
  *width = lanes == 1 ? 1 : 2;
  const int per_lane_tenths = (gbps * 10 + lanes - 1) / lanes;
  *speed = kSpeeds[sizeof(kSpeeds) / sizeof(kSpeeds[0]) - 1].code;
  for (const auto& s : kSpeeds) {
    if (s.tenths >= per_lane_tenths) {
      *speed = s.code;
      break;
    }
  }
}

}  // namespace rails
}  // namespace kvrail::transport::softverbs
