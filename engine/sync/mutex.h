// A mutex that clang's thread-safety analysis (-Wthread-safety) and ThreadSanitizer both see.
//
// absl::Mutex carries the analysis' annotations, but Debian's libabsl is not built for TSan,
// whose reports then name races that are not there; std::mutex is what TSan sees, but libstdc++
// does not annotate it. kvrail::Mutex is a std::mutex with the annotations, so members can say
// ABSL_GUARDED_BY(mu_) and functions ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_), and clang checks every
// access at compile time while TSan checks the interleavings at run time.
//
//   kvrail::Mutex mu_;
//   std::condition_variable cv_;
//   std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
//
//   kvrail::MutexLock lock(&mu_);
//   mu_.Await(cv_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !jobs_.empty(); });
#ifndef KVRAIL_ENGINE_SYNC_MUTEX_H_
#define KVRAIL_ENGINE_SYNC_MUTEX_H_

#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace kvrail {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

  // Waits on `cv` until `ready()` is true (checked with the lock held, as after each wakeup);
  // the lock is held again when it returns. Whoever makes `ready` true notifies `cv`.
  template <typename Ready>
  void Await(std::condition_variable& cv, Ready ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv.wait(lock, ready);
    lock.release();  // still held: the caller's MutexLock releases it
  }

  // Waits on `cv` once, for at most `timeout`: until notified, the time is up, or a spurious
  // wakeup; the caller checks what it waits for. The lock is held again when it returns.
  void WaitFor(std::condition_variable& cv, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv.wait_for(lock, absl::ToChronoNanoseconds(timeout));
    lock.release();
  }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_SYNC_MUTEX_H_
