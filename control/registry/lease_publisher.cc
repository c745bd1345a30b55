#include "control/registry/lease_publisher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "engine/sync/thread_name.h"

namespace kvrail::registry {

absl::StatusOr<std::unique_ptr<LeasePublisher>> LeasePublisher::Start(const std::string& endpoint,
                                                                      absl::Duration ttl) {
  ttl = std::max(ttl, absl::Seconds(1));
  EtcdClient client(endpoint);
  if (absl::Status health = client.Health(); !health.ok()) return health;
  auto lease = client.GrantLease(ttl);
  if (!lease.ok()) return lease.status();
  auto publisher = std::unique_ptr<LeasePublisher>(new LeasePublisher(endpoint, ttl, *lease));
  publisher->thread_ = std::thread([p = publisher.get()] { p->Run(); });
  NameThread(publisher->thread_, "kvrail-lease");
  return publisher;
}

LeasePublisher::LeasePublisher(std::string endpoint, absl::Duration ttl, int64_t lease)
    : endpoint_(std::move(endpoint)),
      ttl_(ttl),
      client_(endpoint_),
      outage_("registry publisher (etcd at " + endpoint_ + ")"),
      lease_(lease) {}

LeasePublisher::~LeasePublisher() { Stop(); }

void LeasePublisher::Publish(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    dirty_.insert(key);
  }
  changed_.notify_all();
}

bool LeasePublisher::AwaitWritten(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return written_.wait_for(lock, absl::ToChronoMicroseconds(timeout),
                           [this] { return dirty_.empty(); });
}

int64_t LeasePublisher::lease() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lease_;
}

void LeasePublisher::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = lease_;
    lease_ = 0;
  }
  if (lease != 0) {
    if (absl::Status revoked = client_.RevokeLease(lease); !revoked.ok()) {
      spdlog::warn("registry publisher: {}; its keys expire with the lease",
                   std::string(revoked.message()));
    }
  }
}

void LeasePublisher::Run() {
  const absl::Duration renew_every = ttl_ / 3;
  absl::Time next_renewal = absl::Now() + renew_every;
  for (;;) {
    int64_t lease = 0;
    std::vector<std::pair<std::string, std::string>> writes;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait_until(lock, absl::ToChronoTime(next_renewal),
                          [this] { return stop_ || !dirty_.empty(); });
      if (stop_) return;
      lease = lease_;
      for (const std::string& key : dirty_) writes.emplace_back(key, values_[key]);
    }
    bool ok = true;
    if (lease == 0) {
      auto granted = client_.GrantLease(ttl_);
      if (granted.ok()) {
        lease = *granted;
        std::lock_guard<std::mutex> lock(mu_);
        lease_ = lease;
        writes.clear();
        for (const auto& [key, value] : values_) writes.emplace_back(key, value);
      } else {
        outage_.Failed(granted.status());
        ok = false;
      }
    }
    std::vector<std::pair<std::string, std::string>> written;
    for (const auto& [key, value] : writes) {
      if (!ok) break;
      auto put = client_.Put(key, value, lease);
      if (put.ok()) {
        written.emplace_back(key, value);
      } else {
        ok = false;
        if (absl::IsNotFound(put.status())) {
          std::lock_guard<std::mutex> lock(mu_);
          lease_ = 0;  // granted anew next round, then every key written again
        }
        outage_.Failed(put.status());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A key published again while it was written stays dirty: its new value goes next.
      for (const auto& [key, value] : written) {
        if (values_[key] == value) dirty_.erase(key);
      }
    }
    written_.notify_all();
    if (absl::Now() >= next_renewal) {
      next_renewal = absl::Now() + renew_every;
      if (ok && lease != 0) {
        auto renewed = client_.KeepAlive(lease);
        if (absl::IsNotFound(renewed.status())) {
          spdlog::warn(
              "registry publisher: lease {} expired at etcd {}; granting a new one and "
              "writing every key again",
              lease, endpoint_);
          std::lock_guard<std::mutex> lock(mu_);
          lease_ = 0;
          next_renewal = absl::Now();
        } else if (!renewed.ok()) {
          outage_.Failed(renewed.status());
          ok = false;
        }
      }
    }
    if (ok) outage_.Recovered();
    if (!ok) {
      // Retry no faster than once a second while etcd is away.
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
    }
  }
}

}  // namespace kvrail::registry
