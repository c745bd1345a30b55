// A rail: one port of one RDMA device that the verbs backend drives, opened through the seam
// (verbs_api.h): its context, protection domain, the GID the backend addresses it by, its MTU
// and link speed.
//
// GID selection (RoCE v2 and InfiniBand): a configured GID index wins; otherwise, on an
// Ethernet port, the first RoCE v2 GID that is an IPv4-mapped address (::ffff:a.b.c.d) and whose
// network device is up; otherwise on InfiniBand index 0 (the port GID). A link-local GID
// (fe80::/10) is never chosen by accident: only a configured index can name one. When nothing
// qualifies, opening the rail fails naming the GIDs it saw, so that "handshake failure: wrong
// GID" becomes one line at start-up instead of a QP that never reaches RTS.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_RAIL_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_RAIL_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/transport/verbs/verbs_api.h"

namespace kvrail::transport {

// One entry of a port's GID table, as query_gid_ex reports it.
struct GidEntry {
  uint32_t index = 0;
  ibv_gid gid = {};
  uint32_t type = IBV_GID_TYPE_IB;  // IBV_GID_TYPE_IB, _ROCE_V1, _ROCE_V2
  bool netdev_up = false;           // its network device is up (RoCE); true on InfiniBand
};

// The GID index to use on a port of `link_layer` (IBV_LINK_LAYER_*), by the rule above, or
// nullopt. `configured` (>= 0) must name an entry of `table`.
std::optional<uint32_t> ChooseGid(absl::Span<const GidEntry> table, uint8_t link_layer,
                                  int configured);

// "fe80:0000:...:0001": a GID as rdma-core's tools print it.
std::string GidText(const ibv_gid& gid);
bool IsLinkLocal(const ibv_gid& gid);
// The IPv4 address of an IPv4-mapped GID ("10.0.0.1"), or "" for any other GID.
std::string GidIpv4(const ibv_gid& gid);

// An MTU enum's bytes (IBV_MTU_4096 -> 4096) and back (nearest not above; 0 -> IBV_MTU_256).
int MtuBytes(ibv_mtu mtu);
ibv_mtu MtuFromBytes(uint32_t bytes);
// A port's link speed in Gb/s from its active_speed and active_width; 0 when unknown.
uint32_t PortGbps(const ibv_port_attr& port);

struct RailOptions {
  std::string device;  // empty: this device was found by listing
  uint8_t port = 1;
  int gid_index = -1;  // -1: choose (see above)
};

class Rail {
 public:
  // Opens `device` of `api`, queries its port `options.port` (which must be ACTIVE), chooses a
  // GID and allocates a protection domain. FailedPrecondition naming the device and port for a
  // port that is not active or a GID table with no usable entry; Unavailable naming the verbs
  // call and errno when one fails.
  static absl::StatusOr<std::unique_ptr<Rail>> Open(const VerbsApi& api, ibv_device* device,
                                                    const RailOptions& options);
  ~Rail();
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  const VerbsApi& api() const { return api_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  const std::string& device() const { return device_; }
  uint8_t port() const { return port_; }
  uint16_t lid() const { return lid_; }
  const ibv_gid& gid() const { return gid_; }
  uint32_t gid_index() const { return gid_index_; }
  ibv_mtu mtu() const { return mtu_; }
  uint32_t gbps() const { return gbps_; }
  uint8_t link_layer() const { return link_layer_; }
  uint32_t max_qp_wr() const { return max_qp_wr_; }
  // Scatter-gather entries a work request may carry on this device (ibv_device_attr::max_sge).
  uint32_t max_sge() const { return max_sge_; }

 private:
  explicit Rail(const VerbsApi& api) : api_(api) {}

  const VerbsApi& api_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::string device_;
  uint8_t port_ = 1;
  uint16_t lid_ = 0;
  ibv_gid gid_ = {};
  uint32_t gid_index_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint32_t gbps_ = 0;
  uint8_t link_layer_ = IBV_LINK_LAYER_UNSPECIFIED;
  uint32_t max_qp_wr_ = 0;
  uint32_t max_sge_ = 1;
};

// Opens one rail per named device (`devices`; empty: every device whose port is active), in the
// order given (listing order when empty). NotFound naming the devices seen when a named one is
// missing; FailedPrecondition when the list is empty or no device has an active port; the
// provider's error when it lists no devices at all (libibverbs without RDMA hardware: ENOSYS).
absl::StatusOr<std::vector<std::unique_ptr<Rail>>> OpenRails(
    const VerbsApi& api, const std::vector<std::string>& devices, uint8_t port, int gid_index);

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_RAIL_H_
