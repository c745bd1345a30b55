// The verbs backend's lanes (verbs_transport.h, "Rails and lanes" and "Threads and locks"): a
// lane's completion queue and event channel on every rail (a QP that failed over to another
// rail completes there), the thread that polls them (RunLane), the lane's table of its QPs by
// number, and the completions it delivers holding no lock.
#ifndef KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_LANE_H_
#define KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_LANE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/transport/transport.h"
#include "engine/transport/verbs/verbs_api.h"
#include "engine/transport/verbs/verbs_rail.h"

namespace kvrail::transport::verbs_internal {

struct QpState;

// Deep enough for every work request of 256 peers at the default max_send_wr: a completion queue
// that overruns is fatal to it, on a NIC as in the software provider.
inline constexpr int kCqDepth = 1 << 16;

struct LaneState {
  int index = 0;
  Rail* rail = nullptr;  // its home rail
  int rail_index = 0;
  // One completion queue and event channel per rail: a QP failed over to another rail completes
  // there (a QP's CQ must belong to its device).
  std::vector<ibv_comp_channel*> channels;
  std::vector<ibv_cq*> cqs;
  int wake_fd = -1;
  std::thread thread;
  std::thread::id thread_id;
  std::mutex mu;
  std::map<uint32_t, std::shared_ptr<QpState>> by_qp_num;
  std::vector<std::pair<Completion, absl::Status>> ready;
  bool stop = false;
};

// Lane `index` with home rail `home`: its completion queue and event channel on every rail of
// `rails`, and its wake-up fd. The verbs call's error, naming the device and lane; what was
// made before a failure is in the lane, for CloseLane.
absl::Status OpenLane(const VerbsApi& api, const std::vector<std::unique_ptr<Rail>>& rails,
                      int index, int home, LaneState& lane);
// Destroys what OpenLane made; the lane's thread has ended.
void CloseLane(const VerbsApi& api, LaneState& lane);

// Queues `done` with `status` for delivery on the lane's thread, and wakes it.
void QueueCompletion(LaneState& lane, Completion done, absl::Status status);
void Wake(LaneState& lane);

// The lane's thread: polls every CQ of the lane, hands each work completion to `on_completion`,
// delivers the queued completions holding no lock, sleeps in poll(2) on the event channels and
// the wake-up fd when there is nothing; returns once `stop` is set and nothing is left.
void RunLane(const VerbsApi& api, LaneState& lane,
             absl::FunctionRef<void(LaneState&, const ibv_wc&)> on_completion);

}  // namespace kvrail::transport::verbs_internal

#endif  // KVRAIL_ENGINE_TRANSPORT_VERBS_VERBS_LANE_H_
