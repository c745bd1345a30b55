#include "control/sidecar/owner_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

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

OwnerLoop::OwnerLoop(Driven) : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

void OwnerLoop::Adopt() { owner_id_.store(std::this_thread::get_id()); }

void OwnerLoop::RunPending() {
  uint64_t count;
  (void)!read(wake_fd_, &count, sizeof(count));  // cleared first: a later Post writes again
  while (true) {
    std::deque<std::function<void()>> jobs;
    {
      MutexLock lock(&mu_);
      if (jobs_.empty()) return;
      jobs.swap(jobs_);
    }
    for (std::function<void()>& job : jobs) job();
  }
}

OwnerLoop::~OwnerLoop() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool OwnerLoop::Post(std::function<void()> job) {
  MutexLock lock(&mu_);
  // The owner thread may still post while it drains at Stop (a job's follow-up work).
  if (stopping_ && !OnOwner()) return false;
  const bool first = jobs_.empty();
  jobs_.push_back(std::move(job));
  if (wake_fd_ < 0) {
    work_.notify_one();
  } else if (first) {
    // Driven: the driver polls the eventfd; one write per filling of the queue.
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
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
  while (true) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      mu_.Await(work_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !jobs_.empty();
      });
      if (jobs_.empty()) return;  // stopping, and every posted job has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();  // what it captured goes with it, outside the lock
  }
}

}  // namespace kvrail::sidecar
