// Writes to a registry that may be slow or away, taken off the caller's thread: Put only records
// the value and returns; one thread of the queue's own writes, in order, retrying a failed write
// with backoff until it lands. The bootstrap server's registrations go through one
// (bootstrap_store.h), so that an etcd that is down never holds up a PUT /route.
//
// Bounded by coalescing: a key holds one unwritten value, the latest Put (it keeps the place in
// line of the first unwritten one), so the queue never holds more entries than distinct keys.
// Keys are written in that order, one at a time; a failed write is retried, ahead of the rest,
// after a backoff that doubles from `first_backoff` to `max_backoff` and returns to the first
// after a success. The outage is logged once (OutageLog), and its end once.
//
// The write function runs on the queue's thread only, never under the queue's lock.
#ifndef KVRAIL_CONTROL_REGISTRY_WRITE_QUEUE_H_
#define KVRAIL_CONTROL_REGISTRY_WRITE_QUEUE_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "control/registry/outage_log.h"

namespace kvrail::registry {

struct WriteQueueOptions {
  std::string what = "registry writer";  // names the queue in its log lines
  absl::Duration first_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
};

class WriteQueue {
 public:
  // Writes `value` at `key`; OK once it is stored. Called on the queue's thread only.
  using WriteFn = std::function<absl::Status(const std::string& key, const std::string& value)>;

  // Starts the writer thread.
  explicit WriteQueue(WriteFn write, WriteQueueOptions options = {});
  ~WriteQueue();  // Stop(absl::ZeroDuration())
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  // Queues `value` for `key`, replacing an unwritten older one. Never waits for a write. False
  // (and nothing queued) after Stop.
  bool Put(const std::string& key, const std::string& value);
  // Waits until `key` has no unwritten value (or `timeout` passed): false on timeout.
  bool AwaitWritten(const std::string& key, absl::Duration timeout);
  // Waits until every value Put so far is written (or `timeout` passed): false on timeout.
  bool AwaitEmpty(absl::Duration timeout);
  // The keys with an unwritten value (the one being written included).
  size_t size() const;

  // Writes what it can of the queue within `flush_deadline` (retrying failures with the same
  // backoff), then joins the thread. A write in progress at the deadline is waited for (the
  // write function's own timeout bounds it). Returns how many keys were left unwritten (each
  // logged). Idempotent; later calls return 0.
  size_t Stop(absl::Duration flush_deadline);

 private:
  void Run();

  const WriteFn write_;
  const WriteQueueOptions options_;
  OutageLog outage_;

  // std::mutex: TSan sees it (Debian's absl is not instrumented).
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a Put, or stop_
  std::condition_variable written_;  // an entry left the queue
  struct Entry {
    std::string value;
    uint64_t version = 0;  // bumped by each Put: a write lands the version it read, no newer
  };
  std::map<std::string, Entry> entries_;  // guarded by mu_: each key's unwritten value
  std::deque<std::string> order_;         // guarded by mu_: entries_' keys, in line
  uint64_t next_version_ = 1;             // guarded by mu_
  bool stop_ = false;                     // guarded by mu_
  absl::Time flush_until_;                // guarded by mu_; set with stop_
  bool stopped_ = false;                  // Stop's, on the caller's thread
  std::thread thread_;
};

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_WRITE_QUEUE_H_
