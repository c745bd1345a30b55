#include "engine/transport/ucx/ucx_memory.h"

#include <fcntl.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "engine/transport/shared_region.h"
#include "engine/transport/ucx/ucx_context.h"

namespace kvrail::transport::ucx_internal {

void RegionState::Release(ucp_context_h context) {
  ucp_mem_unmap(context, memh);
  memh = nullptr;
  if (shared_fd >= 0) close(shared_fd);
  shared_fd = -1;
}

absl::StatusOr<std::unique_ptr<RegionState>> MapRegion(ucp_context_h context,
                                                       const LocalRegion& region) {
  const uint64_t base = reinterpret_cast<uintptr_t>(region.base);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = region.base;
  mp.length = region.length;
  auto state = std::make_unique<RegionState>();
  ucs_status_t s = ucp_mem_map(context, &mp, &state->memh);
  if (s != UCS_OK) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region [0x%x, +%u): ucp_mem_map failed: %s", base, region.length, Ucs(s)));
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  s = ucp_rkey_pack(context, state->memh, &packed, &packed_size);
  if (s != UCS_OK) {
    ucp_mem_unmap(context, state->memh);
    return absl::InvalidArgumentError(absl::StrFormat(
        "local region [0x%x, +%u): ucp_rkey_pack failed: %s", base, region.length, Ucs(s)));
  }
  state->rkey.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  return state;
}

std::optional<SharedSegment> AllocateSharedSegment(ucp_context_h context, uint64_t length) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = length;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  auto state = std::make_unique<RegionState>();
  if (ucp_mem_map(context, &mp, &state->memh) != UCS_OK) return std::nullopt;
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  absl::StatusOr<BackingFd> backing = absl::UnknownError("ucp_mem_query failed");
  if (ucp_mem_query(state->memh, &attr) == UCS_OK && attr.length >= length) {
    backing = FindBackingFd(attr.address);
  }
  void* packed = nullptr;
  size_t packed_size = 0;
  // Only a UCX segment that another process can open is the "ucx-shm" placement; memory UCX
  // took from mmap or the heap (no shared-memory transport loaded) is given back.
  if (backing.ok() && backing->contiguous >= length &&
      (state->shared_fd = fcntl(backing->fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
      ucp_rkey_pack(context, state->memh, &packed, &packed_size) == UCS_OK) {
    state->rkey.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
    return SharedSegment{
        .state = std::move(state), .address = attr.address, .fd_offset = backing->offset};
  }
  state->Release(context);
  return std::nullopt;
}

}  // namespace kvrail::transport::ucx_internal
