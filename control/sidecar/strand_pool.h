// A fixed pool of threads running jobs in strands: jobs of one key run one at a time, in the
// order they were posted; jobs of different keys run in parallel. The sidecar runs what may
// block on a peer (descriptor fetches, connects, copy expansion) in that peer's strand, so one
// dead or slow peer holds one thread of the pool and delays only its own rooms
// (docs/ARCHITECTURE.md, "Threads of a sidecar").
//
// A key's strand exists only while it has jobs: nothing grows with the number of peers ever
// seen. Thread-safe.
#ifndef KVRAIL_CONTROL_SIDECAR_STRAND_POOL_H_
#define KVRAIL_CONTROL_SIDECAR_STRAND_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvrail::sidecar {

class StrandPool {
 public:
  // Starts `threads` threads (at least 1), named "<name><i>" (top -H, perf, gdb).
  StrandPool(int threads, const std::string& name);
  ~StrandPool();  // Stop()
  StrandPool(const StrandPool&) = delete;
  StrandPool& operator=(const StrandPool&) = delete;

  // Runs `job` after every job posted earlier with the same key. Dropped after Stop.
  void Post(const std::string& key, std::function<void()> job);

  // Runs the jobs already posted, then joins the threads. Idempotent.
  void Stop();

  // Keys with jobs queued or running.
  size_t strands() const;

 private:
  struct Strand {
    std::deque<std::function<void()>> jobs;
    bool running = false;  // a thread is running this strand's front job
  };
  void Run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Strand> strands_;
  std::deque<std::string> ready_;  // keys with jobs and no thread on them
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_STRAND_POOL_H_
