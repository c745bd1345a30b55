// The UCX backend's memory and registration (ucx_transport.h): a local region mapped with UCX
// (ucp_mem_map) and its rkey packed for the descriptor, and Allocate's "ucx-shm" placement, UCX's
// own shared-memory segment that UCX peers on this host write with plain stores.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_MEMORY_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_MEMORY_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/transport/region_table.h"
#include "engine/transport/transport.h"

namespace kvrail::transport::ucx_internal {

// What UCX holds for one registration.
struct RegionState {
  ucp_mem_h memh = nullptr;
  std::string rkey;    // ucp_rkey_pack bytes
  int shared_fd = -1;  // Allocate's "ucx-shm" placement: our dup of UCX's segment fd
  // Unmaps (and for an allocated region frees) the memory. Runs under the transport's mutex.
  void Release(ucp_context_h context);
};

// A transport's registrations (region_table.h).
using Regions = RegionTable<std::unique_ptr<RegionState>>;

// Maps `region` (checked: bounds.h CheckLocalRegion) with UCX and packs its rkey.
// InvalidArgument naming the region and UCX's status when either fails (nothing is held then).
absl::StatusOr<std::unique_ptr<RegionState>> MapRegion(ucp_context_h context,
                                                       const LocalRegion& region);

// UCX's own shared-memory segment of `length` bytes, mapped, with its rkey packed and a dup of
// the fd that another process opens to map it. Nullopt, holding nothing, when UCX's memory is
// not such a segment (no shared-memory transport loaded, /dev/shm full): Allocate then falls
// back to the memfd placement.
struct SharedSegment {
  std::unique_ptr<RegionState> state;
  void* address = nullptr;
  uint64_t fd_offset = 0;
};
std::optional<SharedSegment> AllocateSharedSegment(ucp_context_h context, uint64_t length);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_MEMORY_H_
