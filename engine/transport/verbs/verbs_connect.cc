#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/error.h"
#include "engine/transport/verbs/verbs_connector.h"
#include "engine/transport/verbs/verbs_lane.h"
#include "engine/transport/verbs/verbs_memory.h"
#include "engine/transport/verbs/verbs_peer.h"
#include "engine/transport/verbs/verbs_qp.h"
#include "engine/transport/verbs/verbs_rail.h"
#include "engine/transport/verbs/verbs_transport.h"

namespace kvrail::transport {

using verbs_internal::CreateQp;
using verbs_internal::DestroyQp;
using verbs_internal::LaneState;
using verbs_internal::Op;
using verbs_internal::PeerState;
using verbs_internal::QpState;
using verbs_internal::QpToRtr;
using verbs_internal::QpToRts;
using verbs_internal::RandomPsn;
using verbs_internal::Responder;

// The QP exchange, both ends: a requester's QPs for a peer's lanes (ConnectLanes), the
// responder's QPs for a peer's request (OnConnectRequest, OnRelease), and a QP retired (the
// fence) and closed.

absl::Status VerbsTransport::ConnectLanes(PeerState& peer, const std::vector<int>& lanes,
                                          absl::Duration timeout) {
  for (int lane_index : lanes) {
    QpState& qp = *peer.qps[lane_index];
    LaneState& lane = *qp.lane;
    int rail_index;
    int remote_lane;
    int generation;
    {
      std::lock_guard<std::mutex> lock(qp.mu);
      rail_index = qp.rail;
      remote_lane = qp.remote_lane;
      generation = ++qp.generation;
    }
    const Rail& rail = *rails_[rail_index];
    const v1::VerbsLaneAddress& remote = peer.lanes[remote_lane];
    KVRAIL_ASSIGN_OR_RETURN(
        ibv_qp * raw,
        CreateQp(api_, rail, lane.cqs[rail_index], options_.max_send_wr, options_.max_send_sge,
                 absl::StrCat(rail.device(), ", lane ", lane_index)));
    const uint32_t psn = RandomPsn();
    v1::VerbsConnectRequest request;
    request.set_connection_id(absl::StrCat(peer.connection_base, ".", lane_index, ".", generation));
    request.set_provider(api_.provider);
    request.set_writer(options_.writer_name);
    v1::VerbsQpInfo* info = request.add_qps();
    info->set_lane(remote_lane);
    info->set_qp_num(raw->qp_num);
    info->set_psn(psn);
    info->set_lid(rail.lid());
    info->set_gid(std::string(reinterpret_cast<const char*>(rail.gid().raw), 16));
    info->set_mtu_bytes(MtuBytes(rail.mtu()));
    auto reply = RequestVerbsConnect(remote.connect_endpoint(), request, timeout);
    absl::Status status = reply.status();
    if (status.ok() && reply->qps_size() != 1) {
      status = absl::DataLossError(absl::StrCat("verbs connect to ", remote.connect_endpoint(),
                                                ": answered ", reply->qps_size(), " QPs for 1"));
    }
    const ibv_mtu mtu = MtuFromBytes(
        std::min<uint32_t>(MtuBytes(rail.mtu()), status.ok() ? reply->qps(0).mtu_bytes() : 0));
    if (status.ok()) status = QpToRtr(api_, raw, rail, reply->qps(0), mtu);
    if (status.ok()) status = QpToRts(api_, raw, psn, options_.qp_timeout, options_.qp_retry_cnt);
    if (!status.ok()) {
      DestroyQp(api_, raw);
      if (reply.ok()) {
        v1::VerbsRelease release;
        release.set_connection_id(request.connection_id());
        SendVerbsRelease(remote.connect_endpoint(), release, absl::ZeroDuration());
      }
      return absl::Status(status.code(), absl::StrCat(peer.name, ", lane ", lane_index, " on ",
                                                      rail.device(), ": ", status.message()));
    }
    std::lock_guard<std::mutex> lock(qp.mu);
    if (qp.state == QpState::State::kClosed || peer.closed.load()) {
      DestroyQp(api_, raw);
      return absl::CancelledError(absl::StrCat(peer.name, ": disconnected while connecting"));
    }
    qp.qp = raw;
    qp.connection_id = request.connection_id();
    qp.remote_rail = peer.lanes[reply->qps(0).lane() % peer.lanes.size()].rail();
    qp.state = QpState::State::kReady;
    qp.error = absl::OkStatus();
    qp.outstanding = 0;
    qp.completed_wr = qp.next_wr - 1;
    {
      std::lock_guard<std::mutex> lane_lock(lane.mu);
      lane.by_qp_num[raw->qp_num] = peer.qps[lane_index];
    }
    PumpLocked(qp);
  }
  return absl::OkStatus();
}

v1::VerbsConnectReply VerbsTransport::OnConnectRequest(const v1::VerbsConnectRequest& request) {
  v1::VerbsConnectReply reply;
  if (request.provider() != api_.provider) {
    reply.set_error(absl::StrCat("this transport runs verbs provider \"", api_.provider,
                                 "\", the request comes from \"", request.provider(), "\""));
    return reply;
  }
  if (request.connection_id().empty() || request.connection_id().size() > 256 ||
      request.qps_size() < 1 || request.qps_size() > 64) {
    reply.set_error("a connect request needs a connection id of 1 to 256 bytes and 1 to 64 QPs");
    return reply;
  }
  {
    std::lock_guard<std::mutex> lock(responders_mu_);
    if (responders_.count(request.connection_id()) != 0) {
      reply.set_error(absl::StrCat("connection \"", request.connection_id(), "\" exists already"));
      return reply;
    }
    if (static_cast<int>(responders_.size()) >= options_.max_connections) {
      reply.set_error(absl::StrCat("this transport holds ", responders_.size(),
                                   " connections, its limit (max_connections)"));
      return reply;
    }
  }
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) {
      reply.set_error("the transport is closed");
      return reply;
    }
  }
  auto responder = std::make_unique<Responder>();
  responder->writer = request.writer();
  auto fail = [&](const absl::Status& status) {
    for (ibv_qp* qp : responder->qps) DestroyQp(api_, qp);
    reply.Clear();
    reply.set_error(std::string(status.message()));
    return reply;
  };
  for (const v1::VerbsQpInfo& remote : request.qps()) {
    if (remote.gid().size() != 16) {
      return fail(absl::InvalidArgumentError("a requester QP's GID must be 16 bytes"));
    }
    LaneState& lane = *lanes_[remote.lane() % lanes_.size()];
    absl::StatusOr<ibv_qp*> qp =
        CreateQp(api_, *lane.rail, responder_cqs_[lane.rail_index], options_.max_send_wr,
                 /*max_send_sge=*/1,
                 absl::StrCat(lane.rail->device(), ", lane ", lane.index, " (responder)"));
    if (!qp.ok()) return fail(qp.status());
    responder->qps.push_back(*qp);
    const ibv_mtu mtu =
        MtuFromBytes(std::min<uint32_t>(MtuBytes(lane.rail->mtu()), remote.mtu_bytes()));
    if (absl::Status s = QpToRtr(api_, *qp, *lane.rail, remote, mtu); !s.ok()) return fail(s);
    const uint32_t psn = RandomPsn();
    if (absl::Status s = QpToRts(api_, *qp, psn, options_.qp_timeout, options_.qp_retry_cnt);
        !s.ok())
      return fail(s);
    v1::VerbsQpInfo* info = reply.add_qps();
    info->set_lane(lane.index);
    info->set_qp_num((*qp)->qp_num);
    info->set_psn(psn);
    info->set_lid(lane.rail->lid());
    info->set_gid(std::string(reinterpret_cast<const char*>(lane.rail->gid().raw), 16));
    info->set_mtu_bytes(MtuBytes(lane.rail->mtu()));
  }
  std::lock_guard<std::mutex> lock(responders_mu_);
  responders_[request.connection_id()] = std::move(responder);
  return reply;
}

void VerbsTransport::OnRelease(const v1::VerbsRelease& release) {
  std::unique_ptr<Responder> responder;
  {
    std::lock_guard<std::mutex> lock(responders_mu_);
    auto it = responders_.find(release.connection_id());
    if (it == responders_.end()) return;
    responder = std::move(it->second);
    responders_.erase(it);
  }
  for (ibv_qp* qp : responder->qps) DestroyQp(api_, qp);
}

absl::StatusOr<size_t> VerbsTransport::RefuseWriter(std::string_view writer) {
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) return absl::FailedPreconditionError("RefuseWriter: the transport is closed");
  }
  if (writer.empty()) return 0;
  std::vector<std::unique_ptr<Responder>> refused;
  {
    std::lock_guard<std::mutex> lock(responders_mu_);
    for (auto it = responders_.begin(); it != responders_.end();) {
      if (it->second->writer != writer) {
        ++it;
        continue;
      }
      refused.push_back(std::move(it->second));
      it = responders_.erase(it);
    }
  }
  // A destroyed responder QP takes nothing more: the NIC drops what arrives for it, and the
  // software provider what is left in its ring (softverbs.h, "Fencing").
  size_t qps = 0;
  for (const auto& responder : refused) {
    for (ibv_qp* qp : responder->qps) DestroyQp(api_, qp);
    qps += responder->qps.size();
  }
  return qps;
}

void VerbsTransport::ClosePeer(PeerState& peer, const absl::Status& cancelled) {
  peer.closed.store(true);
  for (auto& qp_ptr : peer.qps) {
    QpState& qp = *qp_ptr;
    std::lock_guard<std::mutex> lock(qp.mu);
    qp.state = QpState::State::kClosed;
    // The fence: once the QP is in the error state and destroyed, nothing of it lands.
    RetireQpLocked(qp, Destroy::kNow);
    for (Op* op : qp.posted) FinishLocked(qp, op, cancelled);
    for (Op* op : qp.waiting) FinishLocked(qp, op, cancelled);
    qp.posted.clear();
    qp.waiting.clear();
  }
}

void VerbsTransport::RetireQpLocked(QpState& qp, Destroy when) {
  if (qp.qp == nullptr) return;
  {
    std::lock_guard<std::mutex> lane_lock(qp.lane->mu);
    qp.lane->by_qp_num.erase(qp.qp->qp_num);
  }
  ibv_qp* const retired = qp.qp;
  qp.qp = nullptr;
  // The fence, before anyone hears of the failure or the disconnect.
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_ERR;
  api_.modify_qp(retired, &attr, IBV_QP_STATE);
  if (when == Destroy::kNow) api_.destroy_qp(retired);
  v1::VerbsRelease release;
  release.set_connection_id(qp.connection_id);
  const std::string endpoint = qp.peer->lanes[qp.remote_lane].connect_endpoint();
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (worker_stop_) {
    // Close: the worker is gone or going; a release that cannot wait is sent from here, handed
    // to the socket without waiting.
    if (when == Destroy::kOnWorker) api_.destroy_qp(retired);
    SendVerbsRelease(endpoint, release, absl::ZeroDuration());
    return;
  }
  // The worker runs every job queued before it stops, and Close joins it before the CQs and
  // the protection domain go: a QP destroyed there is destroyed before them.
  worker_jobs_.push_back(
      [this, endpoint, release, destroy = when == Destroy::kOnWorker ? retired : nullptr] {
        if (destroy != nullptr) api_.destroy_qp(destroy);
        SendVerbsRelease(endpoint, release);
      });
  worker_cv_.notify_one();
}

}  // namespace kvrail::transport
