// A reader-writer mutex that clang's thread-safety analysis and ThreadSanitizer both see: a
// std::shared_mutex with the annotations, as kvrail::Mutex is a std::mutex with them (mutex.h).
//
//   kvrail::SharedMutex mu_;
//   std::unordered_map<uint32_t, Mr*> mrs_ ABSL_GUARDED_BY(mu_);
//
//   { kvrail::ReaderMutexLock lock(&mu_); ... read mrs_ ... }
//   { kvrail::WriterMutexLock lock(&mu_); ... change mrs_ ... }
#ifndef KVRAIL_ENGINE_SYNC_SHARED_MUTEX_H_
#define KVRAIL_ENGINE_SYNC_SHARED_MUTEX_H_

#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace kvrail {

class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex shared (with other readers) for its scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~WriterMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace kvrail

#endif  // KVRAIL_ENGINE_SYNC_SHARED_MUTEX_H_
