#include "engine/transport/ucx/ucx_puts.h"

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/strings/str_format.h"
#include "engine/memory/prefault.h"
#include "engine/transport/landing_copy.h"
#include "engine/transport/ucx/ucx_lane.h"

namespace kvrail::transport::ucx_internal {

void MapRegions(PeerState& state) {
  const PeerLane& pl = state.lanes[0];
  for (size_t r = 0; r < pl.rkeys.size(); ++r) {
    void* local = nullptr;
    const uint64_t base = state.remote_bases[r];
    if (pl.rkeys[r] == nullptr || ucp_rkey_ptr(pl.rkeys[r], base, &local) != UCS_OK) continue;
    state.mapped[r] = 1;
    state.mapped_delta[r] = reinterpret_cast<intptr_t>(local) - static_cast<intptr_t>(base);
    state.prefault[r] =
        std::make_unique<Prefaulter>(static_cast<std::byte*>(local), state.remote_lengths[r]);
  }
}

std::byte* MappedAddress(const PeerState& state, int region, uint64_t address) {
  if (state.mapped[region] == 0) return nullptr;
  return reinterpret_cast<std::byte*>(static_cast<intptr_t>(address) + state.mapped_delta[region]);
}

void IssuePuts(Lane& lane, PeerLane& pl, Op* op) {
  PeerState& state = *op->peer;
  ucp_request_param_t param = RequestParam(op);
  const size_t count = op->writes.size();
  bool stored = false;
  for (size_t i = 0; i < count; ++i) {
    const Write& w = op->writes[i];
    // Into a region UCX maps here, a write is a plain store on this thread, as UCX's own put
    // into such memory would be, without a UCX call per write (a head-sliced room's rows are
    // a KiB each).
    // A strided write (a head-sliced page) is its rows, stored or put one by one from the one
    // description: nothing above expanded it.
    if (std::byte* to = MappedAddress(state, op->region_of[i], w.remote_address)) {
      state.prefault[op->region_of[i]]->Before(to, RemoteSpan(w));
      LandingCopyRows(to, w.remote_stride, op->base + w.local_offset, w.local_stride, w.length,
                      w.rows, lane.shared->landing_stores);
      stored = true;
      continue;
    }
    bool failed = false;
    for (uint64_t row = 0; row < w.rows && !failed; ++row) {
      ucs_status_ptr_t request =
          ucp_put_nbx(pl.ep, op->base + w.local_offset + row * w.local_stride, w.length,
                      w.remote_address + row * w.remote_stride, pl.rkeys[op->region_of[i]], &param);
      if (request == nullptr) continue;
      if (UCS_PTR_IS_ERR(request)) {
        op->status = PostFailure(
            request, absl::StrFormat("%s: write %d of %d: ucp_put_nbx",
                                     BatchContext(state.id, lane.index, op->source), i, count));
        failed = true;
        break;
      }
      ++op->requests;
    }
    if (failed) break;
  }
  // The stores are visible to the peer before anything this lane does next (a flush's answer,
  // the caller's status message) can be.
  if (stored) LandingFence();
}

}  // namespace kvrail::transport::ucx_internal
