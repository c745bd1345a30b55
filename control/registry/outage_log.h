// The log of a registry that went away: its first failure is logged at once, later ones at most
// once per `every` (a sidecar that keeps serving with the registry down must not flood its log),
// and its return once. Thread-safe.
#ifndef KVRAIL_CONTROL_REGISTRY_OUTAGE_LOG_H_
#define KVRAIL_CONTROL_REGISTRY_OUTAGE_LOG_H_

#include <spdlog/spdlog.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrail::registry {

class OutageLog {
 public:
  // `what` names who logs ("registry publisher", "registry watcher").
  explicit OutageLog(std::string what, absl::Duration every = absl::Seconds(10))
      : what_(std::move(what)), every_(every) {}

  void Failed(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    ++failures_;
    if (down_ && now - last_logged_ < every_) return;
    spdlog::warn("{}: {} (failures={}); serving on without it", what_,
                 std::string(status.message()), failures_);
    down_ = true;
    last_logged_ = now;
  }
  void Recovered() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!down_) return;
    spdlog::info("{}: the registry answers again after {} failed calls", what_, failures_);
    down_ = false;
    failures_ = 0;
  }

 private:
  const std::string what_;
  const absl::Duration every_;
  std::mutex mu_;           // std::mutex: TSan sees it (Debian's absl is not instrumented)
  bool down_ = false;       // guarded by mu_
  uint64_t failures_ = 0;   // guarded by mu_
  absl::Time last_logged_;  // guarded by mu_
};

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_OUTAGE_LOG_H_
