#include "control/registry/write_queue.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "engine/sync/thread_name.h"

namespace kvrail::registry {

WriteQueue::WriteQueue(WriteFn write, WriteQueueOptions options)
    : write_(std::move(write)),
      options_(std::move(options)),
      // Once per outage: the writer retries every few seconds for as long as it lasts.
      outage_(options_.what, absl::InfiniteDuration()) {
  thread_ = std::thread([this] { Run(); });
  NameThread(thread_, "kvrail-regwrite");
}

WriteQueue::~WriteQueue() { Stop(absl::ZeroDuration()); }

bool WriteQueue::Put(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    auto [it, added] = entries_.try_emplace(key);
    if (added) order_.push_back(key);
    it->second.value = value;
    it->second.version = next_version_++;
  }
  changed_.notify_all();
  return true;
}

bool WriteQueue::AwaitWritten(const std::string& key, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return written_.wait_for(lock, absl::ToChronoMicroseconds(timeout),
                           [&] { return entries_.count(key) == 0; });
}

bool WriteQueue::AwaitEmpty(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return written_.wait_for(lock, absl::ToChronoMicroseconds(timeout),
                           [this] { return entries_.empty(); });
}

size_t WriteQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t WriteQueue::Stop(absl::Duration flush_deadline) {
  if (stopped_) return 0;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    flush_until_ = absl::Now() + flush_deadline;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<std::string> unwritten;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unwritten = order_;
  }
  for (const std::string& key : unwritten) {
    spdlog::warn("{}: stopped with key {} unwritten", options_.what, key);
  }
  return unwritten.size();
}

void WriteQueue::Run() {
  absl::Duration backoff = options_.first_backoff;
  for (;;) {
    std::string key;
    std::string value;
    uint64_t version = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [this] { return stop_ || !order_.empty(); });
      if (order_.empty() || (stop_ && absl::Now() >= flush_until_)) return;
      key = order_.front();
      const Entry& entry = entries_.at(key);
      value = entry.value;
      version = entry.version;
    }
    // No lock held: the write may take as long as the registry makes it.
    const absl::Status written = write_(key, value);
    if (written.ok()) {
      outage_.Recovered();
      backoff = options_.first_backoff;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // Only the writer takes entries out, so the head is still `key`. A value Put while it
        // was written stays, at the head, and goes next.
        auto it = entries_.find(key);
        if (it != entries_.end() && it->second.version == version) {
          entries_.erase(it);
          order_.pop_front();
        }
      }
      written_.notify_all();
      continue;
    }
    outage_.Failed(written);
    std::unique_lock<std::mutex> lock(mu_);
    absl::Time retry_at = absl::Now() + backoff;
    if (stop_) retry_at = std::min(retry_at, flush_until_);
    // Woken early by Stop, which may allow less time than the backoff has left.
    const bool stopping = stop_;
    changed_.wait_until(lock, absl::ToChronoTime(retry_at), [&] { return stop_ != stopping; });
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace kvrail::registry
