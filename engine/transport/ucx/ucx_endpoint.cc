#include "engine/transport/ucx/ucx_endpoint.h"

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/transport/ucx/ucx_am.h"
#include "engine/transport/ucx/ucx_context.h"
#include "engine/transport/ucx/ucx_lane.h"
#include "engine/transport/ucx/ucx_puts.h"

namespace kvrail::transport::ucx_internal {
namespace {

// Error handler for every endpoint: arg is its PeerLane. Runs in UCX calls on that lane's
// worker, on the lane's thread. UCX fails the endpoint's requests itself; flushes waiting for
// the peer's answer (the active-message path) would wait for ever, so they fail here.
void OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  PeerLane& pl = *static_cast<PeerLane*>(arg);
  if (pl.failed == UCS_OK) pl.failed = status;
  std::vector<Op*> waiting;
  for (Op* op : pl.ops) {
    if (op->kind == OpKind::kAmFlush) waiting.push_back(op);
  }
  for (Op* op : waiting) {
    op->home->FinishFlush(
        op, FromUcs(status, absl::StrFormat("flush to peer %d lane %d: the peer's endpoint failed",
                                            pl.peer->id, pl.lane)));
  }
}

}  // namespace

std::string PeerName(const v1::HandshakeDescriptor& peer) {
  if (peer.session_id().empty()) {
    return absl::StrFormat("the peer of a descriptor (version %d) without a session id",
                           peer.version());
  }
  return absl::StrCat("session ", peer.session_id());
}

void StartFlush(Lane& lane, ucp_ep_h ep, Op* op, absl::FunctionRef<std::string()> what) {
  ucp_request_param_t param = RequestParam(op);
  Lane::Hold(op);
  ucs_status_ptr_t request = ucp_ep_flush_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) ++op->requests;
  if (!lane.Release(op)) return;
  if (request == nullptr) {
    lane.FinishFlush(op, absl::OkStatus());
  } else if (UCS_PTR_IS_ERR(request)) {
    lane.FinishFlush(op, PostFailure(request, what()));
  }
}

void IssueConnect(Lane& lane, Op* op) {
  PeerState& state = *op->peer;
  const int index = lane.index;
  PeerLane& pl = state.lanes[index];
  std::shared_ptr<ConnectWait> wait = state.connect_wait;
  // Ends the job without a wireup: Connect hears `status` from this lane.
  const auto fail = [&](absl::Status status) {
    lane.Recycle(op);
    wait->Done(std::move(status));
  };
  if (state.closed) {
    fail(absl::CancelledError(absl::StrFormat("Connect to %s: lane %d: %s before it was connected",
                                              state.name, index, state.why)));
    return;
  }
  const int remote_lane = index % static_cast<int>(state.remote_addresses.size());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(state.remote_addresses[index].data());
  ep.err_handler.cb = OnEndpointError;
  ep.err_handler.arg = &pl;
  // Peer-failure handling wherever UCX has it (tcp, and shared memory as Init configures it);
  // where it has none, the transport falls back, once, to no error handling.
  ep.err_mode = lane.shared->peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ucs_status_t s = ucp_ep_create(lane.worker, &ep, &pl.ep);
  if (s == UCS_ERR_UNREACHABLE && ep.err_mode == UCP_ERR_HANDLING_MODE_PEER) {
    lane.shared->peer_errors = false;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(lane.worker, &ep, &pl.ep);
  }
  if (s != UCS_OK) {
    pl.ep = nullptr;
    fail(absl::UnavailableError(
        absl::StrFormat("Connect to %s: lane %d: ucp_ep_create to peer lane %d failed: %s",
                        state.name, index, remote_lane, Ucs(s))));
    return;
  }
  pl.peer_mode = ep.err_mode == UCP_ERR_HANDLING_MODE_PEER;
  for (size_t r = 0; r < state.remote_keys.size(); ++r) {
    s = ucp_ep_rkey_unpack(pl.ep, state.remote_keys[r].data(), &pl.rkeys[r]);
    if (s != UCS_OK) {
      pl.rkeys[r] = nullptr;
      fail(absl::InvalidArgumentError(absl::StrFormat(
          "peer descriptor: region %d: remote key is not a UCX rkey this transport can use "
          "(ucp_ep_rkey_unpack: %s)",
          r, Ucs(s))));
      return;
    }
  }
  if (index == 0) MapRegions(state);
  lane.outbound[pl.writer.token()] = &state;
  // The writer's name first, before any write (UCX keeps one endpoint's messages in order).
  if (lane.shared->am_writes && !lane.shared->writer_name.empty()) {
    SendHello(pl, lane.shared->writer_name);
  }
  // UCX's wireup finishes with a flush of the new endpoint, progressed by this thread: an
  // unreachable peer is reported by Connect, and no wireup message is left pending when either
  // side's worker is destroyed (UCX 1.13 asserts on a pending wireup reply at
  // ucp_worker_destroy). The job becomes that flush.
  op->kind = OpKind::kFlush;
  op->done = [wait, index, name = state.name](absl::Status status) {
    if (!status.ok()) {
      status = absl::Status(
          status.code(), absl::StrFormat("Connect to %s: lane %d: the peer's worker could not be "
                                         "reached (wireup: %s)",
                                         name, index, status.message()));
    }
    wait->Done(std::move(status));
  };
  pl.ops.push_back(op);
  StartFlush(lane, pl.ep, op, [] { return std::string("ucp_ep_flush_nbx"); });
}

void IssueClose(Lane& lane, Op* job) {
  std::shared_ptr<PeerState> peer = std::move(job->closing);
  lane.Recycle(job);
  PeerLane& pl = peer->lanes[lane.index];
  while (!pl.ops.empty()) lane.Finish(pl.ops.front(), Cancellation(*pl.ops.front(), peer->why));
  // The transport's Close fences (transport.h, (b)): over active messages, write messages the
  // socket took may still reach the target after the endpoint is gone, so a last flush goes
  // first, and the endpoint closes once the target answered it (TearDown).
  if (lane.tearing_down && lane.shared->am_writes && pl.ep != nullptr && pl.failed == UCS_OK &&
      pl.writer.sent() > 0) {
    SendCloseFence(pl);
    lane.fencing.push_back(std::move(peer));
    return;
  }
  CloseEndpoint(lane, std::move(peer));
}

void CloseEndpoint(Lane& lane, std::shared_ptr<PeerState> peer) {
  const int index = lane.index;
  PeerLane& pl = peer->lanes[index];
  lane.outbound.erase(pl.writer.token());
  if (pl.ep == nullptr) {
    peer->DestroyRkeys(index);
    return;
  }
  if (lane.shared->am_writes && pl.failed == UCS_OK) SendBye(pl);
  // A force close (see "Fencing" in the header): UCX drops what it still queues for the peer
  // and sends nothing more. UCX allows it only on endpoints with peer-failure handling; the
  // others close flushing. The lane's rkeys go once its endpoint is closed.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = pl.peer_mode ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(pl.ep, &param);
  pl.ep = nullptr;
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    lane.closing.emplace_back(request, std::move(peer));
  } else {
    peer->DestroyRkeys(index);
  }
}

}  // namespace kvrail::transport::ucx_internal
