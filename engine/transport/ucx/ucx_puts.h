// The UCX backend's writes over shared memory (tls "sm,self": ucx_transport.h): into a region of
// the peer that UCX maps into this process (the peer's own shared-memory segment, from its
// Allocate), a write is a plain store on the lane's thread, its page-table entries made ahead
// (engine/memory/prefault.h); elsewhere it is ucp_put_nbx with the region's rkey. Lane threads
// only, holding the lane's worker mutex.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PUTS_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PUTS_H_

#include <cstddef>
#include <cstdint>

#include "engine/transport/ucx/ucx_endpoint.h"

namespace kvrail::transport::ucx_internal {

// The regions of `state` that UCX maps into this process, through lane 0's rkeys (on lane 0's
// thread, in its connect job, before Connect returns: one mapping for every lane).
void MapRegions(PeerState& state);

// Where a write to `address` of region `region` of the peer lands in this process, if UCX maps
// that region here (a plain store then writes it); else null.
std::byte* MappedAddress(const PeerState& state, int region, uint64_t address);

// A batch's writes, held (Lane::Hold) by the caller: stores where the region is mapped, puts
// elsewhere. The first put that fails to start sets the op's status and ends the batch.
void IssuePuts(Lane& lane, PeerLane& pl, Op* op);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PUTS_H_
