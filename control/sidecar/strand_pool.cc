#include "control/sidecar/strand_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/sync/thread_name.h"

namespace kvrail::sidecar {

StrandPool::StrandPool(int threads, const std::string& name) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] { Run(); });
    NameThread(threads_.back(), absl::StrCat(name, i));
  }
}

StrandPool::~StrandPool() { Stop(); }

void StrandPool::Post(const std::string& key, std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  Strand& strand = strands_[key];
  strand.jobs.push_back(std::move(job));
  if (!strand.running && strand.jobs.size() == 1) {
    ready_.push_back(key);
    cv_.notify_one();
  }
}

void StrandPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && threads_.empty()) return;
    stop_ = true;
    cv_.notify_all();
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  threads_.clear();
}

size_t StrandPool::strands() const {
  std::lock_guard<std::mutex> lock(mu_);
  return strands_.size();
}

void StrandPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  std::string key;       // the strand this thread holds between its jobs
  bool holding = false;  // whether it holds one
  while (true) {
    if (!holding) {
      cv_.wait(lock, [&] { return stop_ || !ready_.empty(); });
      if (ready_.empty()) return;  // stopping, and every posted job has run
      key = std::move(ready_.front());
      ready_.pop_front();
      holding = true;
    }
    Strand& strand = strands_[key];
    strand.running = true;
    std::function<void()> job = std::move(strand.jobs.front());
    strand.jobs.pop_front();
    lock.unlock();
    job();
    job = nullptr;  // what it captured goes before the lock is taken again
    lock.lock();
    Strand& after = strands_[key];  // std::map: the reference stays valid, but look it up again
    after.running = false;
    if (after.jobs.empty()) {
      strands_.erase(key);
      holding = false;
    } else if (!ready_.empty()) {
      // Other strands wait for a thread: this one takes its turn behind them, and this thread
      // takes the first of them (no wakeup: it never waits while ready_ has keys).
      ready_.push_back(std::move(key));
      holding = false;
    }
    // Otherwise this thread runs the strand's next job itself: handing it to another thread
    // cost a futex wakeup and a context switch per job, with one busy peer ping-ponging its
    // jobs over the pool (kvrail bench control).
  }
}

}  // namespace kvrail::sidecar
