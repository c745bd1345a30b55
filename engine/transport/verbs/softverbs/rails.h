// Rails: softverbs devices bound to network devices. The netdev gives the rail its link state
// (IFF_UP|IFF_RUNNING in the calling process's network namespace) and its GIDs.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_RAILS_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_RAILS_H_

#include <infiniband/verbs.h>

#include <optional>
#include <string>

#include "engine/transport/verbs/softverbs/softverbs.h"

namespace kvrail::transport::softverbs::rails {

// True while `netdev` is IFF_UP and IFF_RUNNING as the calling process's network namespace sees
// it (ioctl SIOCGIFFLAGS), cached for 10 ms so the NIC thread can ask on every packet.
bool NetdevUp(const std::string& netdev);

// GID index 0: fe80::/64 with an interface identifier derived from the device and netdev names
// (a real RoCE port derives it from the MAC; rails may share "lo", which has none).
ibv_gid LinkLocalGid(const Rail& rail);
// GID index 1: ::ffff:a.b.c.d for the netdev's first IPv4 address in the current network
// namespace (getifaddrs); none when it has no IPv4 address.
std::optional<ibv_gid> Ipv4Gid(const Rail& rail);

// The port's active width and speed for `gbps` (see softverbs.h).
void SpeedFor(int gbps, uint8_t* width, uint8_t* speed);

}  // namespace kvrail::transport::softverbs::rails

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_SOFTVERBS_RAILS_H_
