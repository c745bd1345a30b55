// The verbs backend's memory and registration (verbs_transport.h, "GPU memory"): a registration
// is one MR per rail (host memory with reg_mr; GPU memory as a dmabuf, or on the device pointer
// with nvidia-peermem), its descriptor remote_key one rkey per rail, 4 LE bytes each.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_MEMORY_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_MEMORY_H_

#include <infiniband/verbs.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/memory/arena.h"
#include "engine/transport/region_table.h"

namespace kvrail::transport::verbs_internal {

struct RegionState {
  bool cuda = false;
  uint64_t base = 0;             // the work requests' source addresses start here
  std::vector<ibv_mr*> mrs;      // one per rail
  std::unique_ptr<Arena> arena;  // Allocate's memfd placement
  // Batches holding this region as their source and not yet complete; Deregister waits for
  // them (their work requests name the region's lkeys).
  std::mutex mu;
  std::condition_variable idle;
  int inflight = 0;
};

// A transport's registrations (region_table.h).
using Regions = RegionTable<std::shared_ptr<RegionState>>;

// A registration's descriptor remote_key: each rail's rkey, 4 LE bytes, in rail order.
std::string PackRkeys(const std::vector<ibv_mr*>& mrs);

// A peer region's rkeys, one per rail, from its descriptor remote_key. InvalidArgument, naming
// `peer` and region `index`, for a key that is not 4 bytes per rail or names fewer rails than
// the peer's lanes (`rails`), or more than 64.
absl::StatusOr<std::vector<uint32_t>> UnpackRkeys(const std::string& key, uint32_t rails,
                                                  const std::string& peer, int index);

}  // namespace kvrail::transport::verbs_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_MEMORY_H_
