#include "control/sidecar/owner_loop.h"

#include "engine/sync/thread_name.h"

namespace kvrail::sidecar {

OwnerLoop::OwnerLoop(const std::string& name) {
  std::promise<void> started;
  std::future<void> has_started = started.get_future();
  thread_ = std::thread([this, &started] {
    owner_id_ = std::this_thread::get_id();
    started.set_value();
    Run();
  });
  NameThread(thread_, name);
  has_started.wait();  // owner_id_ is set before any caller can ask OnOwner
}

OwnerLoop::~OwnerLoop() { Stop(); }

bool OwnerLoop::Post(std::function<void()> job) {
  bool wake = false;
  {
    MutexLock lock(&mu_);
    // The owner thread may still post while it drains at Stop (a job's follow-up work).
    if (stopping_ && !OnOwner()) return false;
    jobs_.push_back(std::move(job));
    posted_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  if (wake) work_.notify_one();
  return true;
}

void OwnerLoop::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

size_t OwnerLoop::queued() const {
  MutexLock lock(&mu_);
  return jobs_.size();
}

void OwnerLoop::Run() {
  // About 10 us of pause instructions: a job posted in that time is taken without a wakeup.
  constexpr int kSpins = 200;
  while (true) {
    for (int i = 0; i < kSpins && posted_.load(std::memory_order_acquire) == 0; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      if (jobs_.empty() && !stopping_) {
        sleeping_ = true;
        mu_.Await(work_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !jobs_.empty();
        });
        sleeping_ = false;
      }
      if (jobs_.empty()) return;  // stopping, and every posted job has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
      posted_.fetch_sub(1, std::memory_order_relaxed);
    }
    job();  // what it captured goes with it, outside the lock
  }
}

}  // namespace kvrail::sidecar
