// kvrail's active-message write protocol (am_protocol.h) over UCX, both ends: a lane's worker
// gets the protocol's handlers (SetAmHandlers), which hand each message to the lane's
// am::AmTarget and send its answers back; a lane's thread sends a batch as the messages
// am::PlanMessages cut it into, and a flush, from the peer lane's am::AmWriter. Lane threads
// only, holding the lane's worker mutex (UCX calls the handlers inside ucp_worker_progress).
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_AM_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_AM_H_

#include <string>

#include "absl/status/status.h"
#include "engine/transport/ucx/ucx_endpoint.h"

namespace kvrail::transport::ucx_internal {

// Registers every message's handler on `lane`'s worker, with the lane as its argument.
// Unavailable with UCX's status.
absl::Status SetAmHandlers(Lane& lane);

// A batch's writes as active messages, held (Lane::Hold) by the caller. The first send that
// fails sets the op's status and ends the batch.
void IssueAmWrites(Lane& lane, PeerLane& pl, Op* op);

// A flush over active messages: done when the peer's answer names its number (or the endpoint
// fails).
void SendAmFlush(Lane& lane, PeerLane& pl, Op* op);

// The writer's name on a new endpoint, its first message (kHelloAm), so that the target may
// refuse it later (Transport::RefuseWriter). Best effort: a writer whose hello is lost is only
// unnamed.
void SendHello(PeerLane& pl, const std::string& name);

// The writer's goodbye on a closing endpoint: the target forgets its token. Best effort.
void SendBye(PeerLane& pl);

// The transport's Close: a last flush on the endpoint, not an operation of the caller's. Its
// answer (OnFlushReplyAm) sets pl.fence_answered: the target has handled every message sent
// before it, so none of them can land after the endpoint closes. Best effort: a target that
// does not answer is waited for only so long (TearDown).
void SendCloseFence(PeerLane& pl);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_AM_H_
