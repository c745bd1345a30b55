// The verbs backend's peers (verbs_transport.h, "Posting" and "Errors"): what a transport keeps
// of a connected peer (its regions and rkeys, its lanes' addresses) and, per local lane, of the
// QP to it: the state of that QP, the batches and flushes queued on it and posted, and the work
// request numbers that tell which of them the last completion covers. Each QP has its own mutex.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_PEER_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_PEER_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/transport/bounds.h"
#include "engine/transport/transport.h"
#include "engine/transport/verbs/verbs_memory.h"
#include "proto/kvrail/v1/verbs.pb.h"

namespace kvrail::transport::verbs_internal {

struct LaneState;
struct PeerState;

struct Op {
  bool flush = false;
  int attempts = 1;  // QPs this batch was posted on (a rail failure resends it on another)
  Completion done;
  std::shared_ptr<RegionState> source;
  std::vector<Write> writes;
  std::vector<int> remote_region;  // each write's index in the peer's regions
  size_t next = 0;                 // the first write not yet posted
  uint64_t last_wr = 0;            // the sequence number of its last posted work request
};

struct QpState {
  enum class State { kConnecting, kReady, kBroken, kClosed };
  std::mutex mu;
  LaneState* lane = nullptr;
  int lane_index = 0;
  PeerState* peer = nullptr;          // owns this
  std::weak_ptr<PeerState> peer_ref;  // the same, for the reconnect worker
  State state = State::kConnecting;
  ibv_qp* qp = nullptr;
  int rail = 0;          // the local rail the QP is on (its lane's home rail unless failed over)
  bool probing = false;  // the rail is being probed back into rotation by this QP
  int remote_lane = 0;   // the peer's lane it connects to
  uint32_t remote_rail = 0;
  std::string connection_id;  // at the peer's connect endpoint
  int generation = 0;
  bool reconnecting = false;
  absl::Status error;  // why the QP broke
  uint64_t next_wr = 1;
  uint64_t completed_wr = 0;
  uint32_t outstanding = 0;
  std::deque<Op*> waiting;  // not yet wholly posted, in order
  std::deque<Op*> posted;   // wholly posted (flushes: queued behind them), in order
  absl::Status since_flush;
  // Reused for each post: the work requests and their scatter-gather entries.
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
};

struct PeerState {
  PeerId id = 0;
  std::string name;  // its session id, or "peer <id>"
  RemoteRegions remote;
  std::vector<std::vector<uint32_t>> rkeys;  // [region][rail]
  std::vector<v1::VerbsLaneAddress> lanes;
  std::string connection_base;
  std::vector<std::shared_ptr<QpState>> qps;  // one per local lane
  std::atomic<bool> closed{false};

  explicit PeerState(RemoteRegions r) : remote(std::move(r)) {}
};

struct Responder {
  std::vector<ibv_qp*> qps;
  std::string writer;  // the requester's name as a writer (VerbsConnectRequest.writer)
};

}  // namespace kvrail::transport::verbs_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_PEER_H_
