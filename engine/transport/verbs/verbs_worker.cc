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

using verbs_internal::Op;
using verbs_internal::PeerState;
using verbs_internal::QpState;

// The worker thread: reconnects of failed QPs, releases of retired ones at the peer, and probes
// of rails out of rotation; off the lanes' threads, so that a lane's other QPs never wait
// behind a firmware command or a peer's answer.

int VerbsTransport::ChooseRail(int home, int avoid) {
  std::lock_guard<std::mutex> lock(health_mu_);
  const absl::Time now = absl::Now();
  if (home != avoid && health_->InRotation(home, now)) return home;
  for (int rail : health_->Up(now)) {
    if (rail != avoid) return rail;
  }
  return home;
}

void VerbsTransport::ScheduleReconnect(std::shared_ptr<PeerState> peer, int lane) {
  // Called with the QP's mutex held.
  QpState& qp = *peer->qps[lane];
  qp.reconnecting = true;
  std::lock_guard<std::mutex> lock(worker_mu_);
  if (worker_stop_) {
    qp.reconnecting = false;
    return;
  }
  worker_jobs_.push_back([this, peer, lane] {
    absl::Status status = peer->closed.load()
                              ? absl::CancelledError("disconnected")
                              : ConnectLanes(*peer, {lane}, options_.reconnect_timeout);
    QpState& qp = *peer->qps[lane];
    std::lock_guard<std::mutex> qp_lock(qp.mu);
    qp.reconnecting = false;
    if (status.ok()) return;  // ConnectLanes pumped what was waiting
    // The batches that waited for the new QP fail with the old QP's error and the reconnect's.
    const absl::Status failed(
        qp.error.ok() ? absl::StatusCode::kUnavailable : qp.error.code(),
        absl::StrCat(qp.error.message(), "; reconnecting failed: ", status.message()));
    while (!qp.waiting.empty()) {
      Op* op = qp.waiting.front();
      qp.waiting.pop_front();
      if (op->flush) {
        FinishFlushLocked(qp, op, failed);
      } else {
        NoteFailureLocked(qp, failed);
        FinishLocked(qp, op,
                     qp.state == QpState::State::kClosed ? absl::CancelledError("peer disconnected")
                                                         : failed);
      }
    }
  });
  worker_cv_.notify_one();
}

void VerbsTransport::RunWorker() {
  std::unique_lock<std::mutex> lock(worker_mu_);
  absl::Time next_probe = absl::Now() + options_.rail_probe_after;
  while (true) {
    const bool woken = worker_cv_.wait_for(
        lock, absl::ToChronoNanoseconds(std::max(next_probe - absl::Now(), absl::ZeroDuration())),
        [this] { return worker_stop_ || !worker_jobs_.empty(); });
    if (!woken) {
      lock.unlock();
      if (rails_.size() > 1) ProbeRails();
      next_probe = absl::Now() + options_.rail_probe_after;
      lock.lock();
      continue;
    }
    if (worker_jobs_.empty()) return;
    std::function<void()> job = std::move(worker_jobs_.front());
    worker_jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

void VerbsTransport::ProbeRails() {
  // A rail out of rotation whose backoff has passed is probed by one idle QP that failed over
  // from it: that QP moves back, and its next completion puts the rail back into rotation (or
  // its failure takes the rail out again, for twice as long, costing that batch one resend).
  // A rail with nobody to probe it returns to rotation at once: whoever uses it next finds out.
  std::vector<std::shared_ptr<PeerState>> peers;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (closed_) return;
    for (const auto& [id, peer] : peers_) peers.push_back(peer);
  }
  while (true) {
    std::optional<int> probe;
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      probe = health_->TakeProbe(absl::Now());
    }
    if (!probe) break;
    bool taken = false;
    for (const auto& peer : peers) {
      for (int lane = 0; lane < static_cast<int>(peer->qps.size()) && !taken; ++lane) {
        QpState& qp = *peer->qps[lane];
        std::lock_guard<std::mutex> lock(qp.mu);
        if (qp.state != QpState::State::kReady || qp.rail == *probe ||
            qp.lane->rail_index != *probe || !qp.posted.empty() || !qp.waiting.empty() ||
            qp.reconnecting) {
          continue;
        }
        // Not a failure: the QP is idle. It is replaced by one on its home rail.
        RetireQpLocked(qp, Destroy::kOnWorker);
        qp.state = QpState::State::kBroken;
        qp.error = absl::UnavailableError("moved back to its home rail");
        qp.rail = *probe;
        qp.probing = true;
        qp.remote_lane = lane % static_cast<int>(peer->lanes.size());
        ScheduleReconnect(peer, lane);
        taken = true;
      }
      if (taken) break;
    }
    if (!taken) {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_->ReportSuccess(*probe, absl::Now());
    }
  }
}

}  // namespace kvrail::transport
