// Test support: records the completions of numbered transport operations, for the
// conformance suite and backend tests. Thread-safe; completions may run on any thread.
#ifndef KVRAIL_ENGINE_TRANSPORT_COMPLETION_RECORDER_H_
#define KVRAIL_ENGINE_TRANSPORT_COMPLETION_RECORDER_H_

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/transport/transport.h"

namespace kvrail::transport {

// How long a test waits for a completion before it calls the transport stuck.
inline constexpr absl::Duration kPatience = absl::Seconds(60);

// Completion `op` of `operations` records its status, the thread it ran on and its order.
class Recorder {
 public:
  explicit Recorder(int operations) : calls_(operations, 0), statuses_(operations) {}

  Completion Callback(int op) {
    return [this, op](absl::Status status) {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_[op];
      statuses_[op] = std::move(status);
      threads_.push_back(std::this_thread::get_id());
      order_.push_back(op);
      changed_.notify_all();
    };
  }

  // True once every operation has completed at least once.
  bool WaitAll(absl::Duration timeout = kPatience) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] {
      return std::all_of(calls_.begin(), calls_.end(), [](int c) { return c > 0; });
    });
  }

  int calls(int op) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[op];
  }
  absl::Status status(int op) {
    std::lock_guard<std::mutex> lock(mu_);
    return statuses_[op];
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }
  std::vector<int> order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }

 private:
  // std::mutex, which TSan sees; Debian's absl::Mutex is not annotated for it.
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<int> calls_;
  std::vector<absl::Status> statuses_;
  std::vector<std::thread::id> threads_;
  std::vector<int> order_;
};

}  // namespace kvrail::transport

#endif  // KVRAIL_ENGINE_TRANSPORT_COMPLETION_RECORDER_H_
