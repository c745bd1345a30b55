#include "engine/transport/verbs/verbs_lane.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/transport/verbs/verbs_qp.h"

namespace kvrail::transport::verbs_internal {
namespace {

constexpr int kPollBatch = 32;

}  // namespace

absl::Status OpenLane(const VerbsApi& api, const std::vector<std::unique_ptr<Rail>>& rails,
                      int index, int home, LaneState& lane) {
  lane.index = index;
  lane.rail_index = home;
  lane.rail = rails[home].get();
  for (const auto& rail : rails) {
    const std::string where = absl::StrCat(rail->device(), ", lane ", index);
    ibv_comp_channel* channel = api.create_comp_channel(rail->context());
    if (channel == nullptr) return VerbsCallError("ibv_create_comp_channel", errno, where);
    lane.channels.push_back(channel);
    ibv_cq* cq = api.create_cq(rail->context(), kCqDepth, &lane, channel, 0);
    if (cq == nullptr) return VerbsCallError("ibv_create_cq", errno, where);
    lane.cqs.push_back(cq);
  }
  const std::string where = absl::StrCat(lane.rail->device(), ", lane ", index);
  lane.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (lane.wake_fd < 0) return VerbsCallError("eventfd", errno, where);
  return absl::OkStatus();
}

void CloseLane(const VerbsApi& api, LaneState& lane) {
  for (ibv_cq* cq : lane.cqs) api.destroy_cq(cq);
  for (ibv_comp_channel* channel : lane.channels) api.destroy_comp_channel(channel);
  if (lane.wake_fd >= 0) close(lane.wake_fd);
  lane.cqs.clear();
  lane.channels.clear();
  lane.wake_fd = -1;
}

void QueueCompletion(LaneState& lane, Completion done, absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    lane.ready.emplace_back(std::move(done), std::move(status));
  }
  Wake(lane);
}

void Wake(LaneState& lane) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(lane.wake_fd, &one, sizeof(one));
}

void RunLane(const VerbsApi& api, LaneState& lane,
             absl::FunctionRef<void(LaneState&, const ibv_wc&)> on_completion) {
  std::vector<ibv_wc> wcs(kPollBatch);
  std::vector<std::pair<Completion, absl::Status>> ready;
  const size_t rails = lane.cqs.size();
  std::vector<bool> armed(rails, false);
  std::vector<pollfd> fds(rails + 1);
  for (size_t r = 0; r < rails; ++r) fds[r] = {lane.channels[r]->fd, POLLIN, 0};
  fds[rails] = {lane.wake_fd, POLLIN, 0};
  while (true) {
    bool polled = false;
    for (ibv_cq* cq : lane.cqs) {
      int n;
      while ((n = api.poll_cq(cq, kPollBatch, wcs.data())) > 0) {
        polled = true;
        for (int i = 0; i < n; ++i) on_completion(lane, wcs[i]);
      }
    }
    bool stop;
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      ready.swap(lane.ready);
      stop = lane.stop;
    }
    for (auto& [done, status] : ready) done(std::move(status));
    const bool delivered = !ready.empty();
    ready.clear();
    if (stop) {
      std::lock_guard<std::mutex> lock(lane.mu);
      if (lane.ready.empty()) return;
      continue;
    }
    if (delivered || polled) continue;
    // Arm, then look again: a completion that came before arming raises no event.
    bool armed_now = false;
    for (size_t r = 0; r < rails; ++r) {
      if (!armed[r]) {
        api.req_notify_cq(lane.cqs[r], 0);
        armed[r] = true;
        armed_now = true;
      }
    }
    if (armed_now) continue;
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (size_t r = 0; r < rails; ++r) {
      if ((fds[r].revents & POLLIN) == 0) continue;
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (api.get_cq_event(lane.channels[r], &cq, &context) == 0) {
        api.ack_cq_events(cq, 1);
        armed[r] = false;
      }
    }
    if (fds[rails].revents & POLLIN) {
      uint64_t count;
      [[maybe_unused]] ssize_t r = read(lane.wake_fd, &count, sizeof(count));
    }
  }
}

}  // namespace kvrail::transport::verbs_internal
