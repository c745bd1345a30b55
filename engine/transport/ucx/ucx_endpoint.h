// The UCX backend's endpoints and connects (ucx_transport.h, "Connect" and "Fencing"): what a
// transport keeps of a peer and, per lane, of its endpoint; the connect job a lane's thread runs
// (the endpoint, the peer's rkeys, the wireup flush) and the close job (the peer's operations on
// the lane cancelled, its endpoint closed). Lane threads only: see ucx_lane.h.
#ifndef KVRAIL_ENGINE_TRANSPORT_UCX_UCX_ENDPOINT_H_
#define KVRAIL_ENGINE_TRANSPORT_UCX_UCX_ENDPOINT_H_

#include <ucp/api/ucp.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "engine/memory/prefault.h"
#include "engine/transport/bounds.h"
#include "engine/transport/peer_process.h"
#include "engine/transport/transport.h"
#include "engine/transport/ucx/am_protocol.h"
#include "proto/kvrail/v1/handshake.pb.h"

namespace kvrail::transport::ucx_internal {

struct Lane;
struct Op;
struct PeerState;

// Connect's wait for the wireup of every lane: told by the lanes' threads.
struct ConnectWait {
  std::mutex mu;
  std::condition_variable changed;
  int pending = 0;       // lanes whose wireup has not completed
  absl::Status failure;  // the first lane's failure
  void Done(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    --pending;
    if (!status.ok() && failure.ok()) failure = std::move(status);
    changed.notify_all();
  }
};

// What one lane keeps of one peer. Only that lane's thread touches it once the peer's connect
// job has been queued (the fields filled before are fixed). One cache line apart from the
// peer's other lanes, which other threads write at once.
struct alignas(64) PeerLane {
  PeerState* peer = nullptr;  // with `lane`, the endpoint's error handler's argument
  int lane = 0;
  am::AmWriter writer;  // the active-message path: this connection's token, messages, flushes
  ucp_ep_h ep = nullptr;
  bool peer_mode = false;         // the endpoint has peer-failure handling
  std::vector<ucp_rkey_h> rkeys;  // [descriptor region index]
  absl::Status error;             // first failure of a batch since the lane's last Flush
  ucs_status_t failed = UCS_OK;   // set by UCX's error handler
  std::deque<Op*> ops;            // undelivered batches and flushes, oldest first
  // The transport's Close over active messages: the number of the last flush, sent before the
  // endpoint closes, and whether the target answered it (every message before it handled).
  uint64_t fence_seq = 0;
  bool fence_answered = false;
  // When this lane last saw the peer's owner alive (OwnerGone): a flush within kOwnerSeenFor
  // of it does not ask again.
  std::chrono::steady_clock::time_point owner_seen_alive{};
};

// A connected (or connecting) peer. Everything but `closed` and `why` is fixed before its
// first job is queued, or is its lanes' (see PeerLane).
struct PeerState {
  PeerId id = 0;
  std::string name;  // for messages: "session <id>" (from the descriptor)
  RemoteRegions regions;
  // What the connect jobs need of the descriptor: the peer's worker address for each local
  // lane, and its regions' packed rkeys.
  std::vector<std::string> remote_addresses;
  std::vector<std::string> remote_keys;
  std::vector<uint64_t> remote_bases;  // [descriptor region index]
  std::vector<uint64_t> remote_lengths;
  // [descriptor region index]: whether UCX maps that region into this process (ucp_rkey_ptr:
  // the peer's own shared-memory segment, from its Allocate), and if so the offset from a
  // remote address in it to the local one. One mapping for every lane: lane 0's, learnt by its
  // connect job before Connect returns (so fixed before any post), so that the lanes share one
  // set of page-table entries: a page that lane 0 wrote in one room and lane 1 writes in the
  // next faults once, not once per lane. Lane 0's rkeys, which hold the mapping, go only after
  // ClosePeer, when no lane stores for the peer any more.
  std::vector<char> mapped;
  std::vector<intptr_t> mapped_delta;
  // For each mapped region: its page-table entries made a chunk at a time ahead of the first
  // stores there (engine/memory/prefault.h), by whichever lane stores first.
  std::vector<std::unique_ptr<Prefaulter>> prefault;
  std::shared_ptr<ConnectWait> connect_wait;
  // The peer's process where it is certainly this host's (UcxTransport::WatchOwner, at the end
  // of Connect): a Flush over puts or stores completes OK only while it lives.
  std::unique_ptr<PeerProcess> owner;
  // ClosePeer ran: written holding every lane's worker mutex, so a lane's thread reads them
  // holding its own. Its jobs still queued are cancelled, not sent.
  bool closed = false;
  const char* why = "";  // why it was closed, for the cancellations
  std::vector<PeerLane> lanes;
  PeerState(RemoteRegions r, int lane_count, size_t region_count) : regions(std::move(r)) {
    lanes.resize(lane_count);
    std::random_device random;
    for (int lane = 0; lane < lane_count; ++lane) {
      PeerLane& pl = lanes[lane];
      pl.peer = this;
      pl.lane = lane;
      pl.writer = am::AmWriter((uint64_t{random()} << 32) ^ random() ^ (uint64_t(lane) << 56));
      pl.rkeys.assign(region_count, nullptr);
    }
  }
  // On the lane's thread, once the lane's endpoint is closed (UCX wants an endpoint's rkeys
  // gone before its worker, and puts still draining at close may use them).
  void DestroyRkeys(int lane) {
    for (ucp_rkey_h& rkey : lanes[lane].rkeys) {
      if (rkey != nullptr) ucp_rkey_destroy(rkey);
      rkey = nullptr;
    }
  }
};

// A peer's name for messages: its descriptor's session id.
std::string PeerName(const v1::HandshakeDescriptor& peer);

// On `lane`'s thread, holding its worker mutex: a connect job (OpKind::kConnect). Creates the
// peer's endpoint on this lane's worker (with peer-failure handling where UCX has it), unpacks
// its rkeys (lane 0 also maps the regions UCX maps into this process: ucx_puts.h) and starts
// UCX's wireup, a flush of the new endpoint, whose completion (or this job's failure) tells the
// peer's ConnectWait; the job becomes that flush.
void IssueConnect(Lane& lane, Op* op);

// On `lane`'s thread, holding its worker mutex: a close job (OpKind::kClose). Cancels the
// peer's operations on this lane, says goodbye on the active-message path, and closes its
// endpoint (forced where it has peer-failure handling: see "Fencing"); the lane's rkeys go once
// the close has finished (Lane::ReapClosed). At the transport's Close over active messages,
// first a last flush whose answer the lane's TearDown waits for (Lane::fencing).
void IssueClose(Lane& lane, Op* job);

// The end of a close job, or of the fence before it (TearDown): says goodbye on the
// active-message path and closes the peer's endpoint on this lane.
void CloseEndpoint(Lane& lane, std::shared_ptr<PeerState> peer);

// A flush of `ep` (Flush over puts, and Connect's wireup): ucp_ep_flush_nbx completes `op`.
// `what` names the call in the error when it fails at once; it is formatted only then (a flush
// per transfer is the common path).
void StartFlush(Lane& lane, ucp_ep_h ep, Op* op, absl::FunctionRef<std::string()> what);

}  // namespace kvrail::transport::ucx_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_UCX_UCX_ENDPOINT_H_
