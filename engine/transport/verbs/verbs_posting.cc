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
#include "absl/time/time.h"
#include "engine/base/error.h"
#include "engine/transport/verbs/verbs_connector.h"
#include "engine/transport/verbs/verbs_lane.h"
#include "engine/transport/verbs/verbs_memory.h"
#include "engine/transport/verbs/verbs_peer.h"
#include "engine/transport/verbs/verbs_qp.h"
#include "engine/transport/verbs/verbs_rail.h"
#include "engine/transport/verbs/verbs_transport.h"

namespace kvrail::transport {

using verbs_internal::LaneState;
using verbs_internal::Op;
using verbs_internal::PeerState;
using verbs_internal::QpState;
using verbs_internal::VerbsCallError;
using verbs_internal::WcStatusText;

// Posting: a QP's queue, its work requests, their completions, and a QP's failure (with
// failover to another rail). Every function here runs holding the QP's mutex.

void VerbsTransport::PumpLocked(QpState& qp) {
  while (qp.state == QpState::State::kReady && !qp.waiting.empty()) {
    Op* op = qp.waiting.front();
    if (op->flush) {
      qp.waiting.pop_front();
      if (qp.posted.empty()) {
        FinishFlushLocked(qp, op);
      } else {
        qp.posted.push_back(op);
      }
      continue;
    }
    const uint32_t room = options_.max_send_wr - qp.outstanding;
    if (room == 0) return;
    const size_t count = std::min<size_t>(room, op->writes.size() - op->next);
    // One work request a write; a write of several rows (gathered into contiguous bytes at the
    // peer: CheckWrites held it to max_send_sge) is one scatter-gather entry a row.
    size_t entries = 0;
    for (size_t i = 0; i < count; ++i) entries += op->writes[op->next + i].rows;
    qp.wrs.resize(count);
    qp.sges.resize(entries);
    LaneState& lane = *qp.lane;
    const uint32_t lkey = op->source->mrs[qp.rail]->lkey;
    const PeerState& peer = *qp.peer;
    ibv_sge* sge = qp.sges.data();
    for (size_t i = 0; i < count; ++i) {
      const Write& write = op->writes[op->next + i];
      ibv_send_wr& wr = qp.wrs[i];
      wr = {};
      wr.wr_id = qp.next_wr + i;
      wr.sg_list = sge;
      wr.num_sge = static_cast<int>(write.rows);
      for (uint64_t row = 0; row < write.rows; ++row, ++sge) {
        sge->addr = op->source->base + write.local_offset + row * write.local_stride;
        sge->length = static_cast<uint32_t>(write.length);
        sge->lkey = lkey;
      }
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = i + 1 == count ? IBV_SEND_SIGNALED : 0;
      wr.wr.rdma.remote_addr = write.remote_address;
      wr.wr.rdma.rkey = peer.rkeys[op->remote_region[op->next + i]][qp.remote_rail];
      wr.next = i + 1 == count ? nullptr : &qp.wrs[i + 1];
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = api_.post_send(qp.qp, qp.wrs.data(), &bad); rc != 0) {
      FailQpLocked(qp,
                   VerbsCallError("ibv_post_send", rc,
                                  absl::StrCat(rails_[qp.rail]->device(), ", lane ", lane.index,
                                               ", to ", peer.name)),
                   /*path_failure=*/false);
      return;
    }
    qp.outstanding += count;
    qp.next_wr += count;
    op->next += count;
    if (op->next == op->writes.size()) {
      op->last_wr = qp.next_wr - 1;
      qp.waiting.pop_front();
      qp.posted.push_back(op);
    }
  }
}

void VerbsTransport::FinishLocked(QpState& qp, Op* op, absl::Status status) {
  std::unique_ptr<Op> owned(op);
  if (owned->source != nullptr) {
    std::lock_guard<std::mutex> lock(owned->source->mu);
    if (--owned->source->inflight == 0) owned->source->idle.notify_all();
  }
  verbs_internal::QueueCompletion(*qp.lane, std::move(owned->done), std::move(status));
}

void VerbsTransport::FinishFlushLocked(QpState& qp, Op* flush, const absl::Status& otherwise) {
  absl::Status status = qp.since_flush.ok() ? otherwise : qp.since_flush;
  qp.since_flush = absl::OkStatus();
  FinishLocked(qp, flush, std::move(status));
}

void VerbsTransport::NoteFailureLocked(QpState& qp, const absl::Status& status) {
  if (qp.since_flush.ok()) qp.since_flush = status;
}

void VerbsTransport::FailQpLocked(QpState& qp, const absl::Status& status, bool path_failure) {
  if (qp.state != QpState::State::kReady) return;
  qp.state = QpState::State::kBroken;
  qp.error = status;
  // To the error state: nothing of it lands any more; destroyed on the worker, and the peer's
  // responder QP is released.
  RetireQpLocked(qp, Destroy::kOnWorker);
  // A path that failed (no acknowledgement within the retry budget) with more than one rail:
  // the rail leaves rotation and its batches are sent again, whole, on a QP over another rail
  // (RDMA writes of the same bytes to the same addresses may land twice; nothing else writes
  // there while the room is in flight). A batch that has been sent on max_attempts QPs fails.
  const bool failover = path_failure && rails_.size() > 1;
  if (failover) {
    const int failed_rail = qp.rail;
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_->ReportFailure(failed_rail, absl::Now());
      ++failovers_;
    }
    qp.probing = false;
    qp.rail = ChooseRail(qp.lane->rail_index, failed_rail);
    // The peer's side of the path may be what failed: ask for a lane on another of its rails.
    const PeerState& peer = *qp.peer;
    const int peer_lanes = static_cast<int>(peer.lanes.size());
    for (int step = 1; step <= peer_lanes; ++step) {
      const int candidate = (qp.remote_lane + step) % peer_lanes;
      if (peer.lanes[candidate].rail() != qp.remote_rail || step == peer_lanes) {
        qp.remote_lane = candidate;
        break;
      }
    }
    std::deque<Op*> again;
    for (Op* op : qp.posted) again.push_back(op);
    for (Op* op : qp.waiting) again.push_back(op);
    qp.posted.clear();
    qp.waiting.clear();
    for (Op* op : again) {
      if (!op->flush && op->next > 0) {
        if (op->attempts >= options_.max_attempts) {
          NoteFailureLocked(qp, status);
          FinishLocked(qp, op, status);
          continue;
        }
        ++op->attempts;
        op->next = 0;
      }
      qp.waiting.push_back(op);
    }
  } else {
    NoteFailureLocked(qp, status);
    // Every batch and flush already posted failed with it; those still waiting go to the next QP.
    for (Op* op : qp.posted) {
      if (op->flush) {
        FinishFlushLocked(qp, op);
      } else {
        FinishLocked(qp, op, status);
      }
    }
    qp.posted.clear();
    // A batch partly posted cannot be resumed on another QP (part of it may have landed): it
    // fails.
    if (!qp.waiting.empty() && !qp.waiting.front()->flush && qp.waiting.front()->next > 0) {
      FinishLocked(qp, qp.waiting.front(), status);
      qp.waiting.pop_front();
    }
    // Flushes at the head report the failure; batches behind them wait for a new QP.
    while (!qp.waiting.empty() && qp.waiting.front()->flush) {
      Op* flush = qp.waiting.front();
      qp.waiting.pop_front();
      FinishFlushLocked(qp, flush);
    }
  }
  qp.outstanding = 0;
  qp.completed_wr = qp.next_wr - 1;
  if (!qp.waiting.empty() && !qp.reconnecting) {
    if (std::shared_ptr<PeerState> peer = qp.peer_ref.lock()) {
      ScheduleReconnect(std::move(peer), qp.lane_index);
    }
  }
}

void VerbsTransport::OnCompletion(LaneState& lane, const ibv_wc& wc) {
  std::shared_ptr<QpState> found;
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    auto it = lane.by_qp_num.find(wc.qp_num);
    if (it == lane.by_qp_num.end()) return;  // a QP destroyed since: its ops were failed then
    found = it->second;
  }
  QpState& qp = *found;
  std::lock_guard<std::mutex> lock(qp.mu);
  if (qp.state != QpState::State::kReady || qp.qp == nullptr || qp.qp->qp_num != wc.qp_num) return;
  if (wc.status != IBV_WC_SUCCESS) {
    FailQpLocked(qp,
                 absl::UnavailableError(absl::StrCat(WcStatusText(wc.status), ", ",
                                                     rails_[qp.rail]->device(), " lane ",
                                                     lane.index, ", writing to ", qp.peer->name)),
                 /*path_failure=*/wc.status == IBV_WC_RETRY_EXC_ERR);
    return;
  }
  if (qp.probing) {
    qp.probing = false;
    std::lock_guard<std::mutex> health_lock(health_mu_);
    health_->ReportSuccess(qp.rail, absl::Now());
  }
  if (wc.wr_id <= qp.completed_wr || wc.wr_id >= qp.next_wr) return;
  qp.outstanding -= static_cast<uint32_t>(wc.wr_id - qp.completed_wr);
  qp.completed_wr = wc.wr_id;
  while (!qp.posted.empty()) {
    Op* op = qp.posted.front();
    if (op->flush) {
      qp.posted.pop_front();
      FinishFlushLocked(qp, op);
    } else if (op->last_wr <= qp.completed_wr) {
      qp.posted.pop_front();
      FinishLocked(qp, op, absl::OkStatus());
    } else {
      break;
    }
  }
  PumpLocked(qp);
}

}  // namespace kvrail::transport
