// The UCX backend's writes over shared memory (tls "sm,self": ucx_transport.h): into a region of
// the peer that UCX maps into this process (the peer's own shared-memory segment, from its
// Allocate), a write is a plain store on the lane's thread, its page-table entries made ahead
// (engine/memory/prefault.h); elsewhere it is ucp_put_nbx with the region's rkey. Lane threads
// only, holding the lane's worker mutex.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PUTS_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PUTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/transport/ucx/ucx_endpoint.h"

namespace kvrail::transport::ucx_internal {

// The regions of `state` that UCX maps into this process, through lane 0's rkeys (on lane 0's
// thread, in its connect job, before Connect returns: one mapping for every lane).
void MapRegions(PeerState& state);

// Where a write to `address` of region `region` of the peer lands in this process, if UCX maps
// that region here (a plain store then writes it); else null.
std::byte* MappedAddress(const PeerState& state, int region, uint64_t address);

// Before a round's jobs (`jobs`, as taken) are issued: where they hold batches of two peers or
// more, the writes that read slices of the same source rows (engine/transport/shared_rows.h:
// each decode rank's heads of a prefill rank's rows) and land in mapped memory are stored a
// source row at a time, each row read once for all of them (decision 0020), and marked in their
// batch's `stored_together` so that IssuePuts skips them. Only batches that Issue would send
// (WhyUnsent: their peer open, its endpoint on this lane sound, their source registered) take
// part, and only
// in a round without connect or close jobs (which change what those checks read). Fenced before
// it returns.
//
// A batch that holds such writes but shared none of them, reads rows later in its source than
// another peer's such batch of the round, and is its peer's last job of the round, waits: it is
// taken out of `jobs` into `waiting` (when not null: not at the lane's stop), to be issued first
// in the lane's next round, once. The other peer's batch of the same rows is then likely there:
// it is posted when that peer's earlier batch completes, which this round delivers. So two
// transfers that fall out of step (one peer's batches a round ahead of the other's) fall back in.
void StoreSharedRows(Lane& lane, std::vector<Op*>& jobs, std::vector<Op*>* waiting);

// A batch's writes, held (Lane::Hold) by the caller: stores where the region is mapped, puts
// elsewhere. The first put that fails to start sets the op's status and ends the batch.
void IssuePuts(Lane& lane, PeerLane& pl, Op* op);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_PUTS_H_
