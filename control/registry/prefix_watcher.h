// Follows every key under a prefix in etcd: lists them once, then watches (POST /v3/watch, whose
// answer is a stream of JSON objects, one a line) from the revision after the list, and hands
// each change to a handler on the watcher's own thread.
//
// The stream is reopened from the last revision seen whenever it ends (every `reconnect_every`
// without news, or etcd going away); when etcd compacted past that revision or restarted
// empty, the prefix is listed again and what changed meanwhile (keys gone included) is handed
// on as puts and deletes, so the handler's view converges on etcd's. Bounded: a value larger
// than kMaxValueBytes or a stream line larger than 4 x kMaxValueBytes is dropped with a log
// line naming the key (or the prefix).
#ifndef KVRAIL_CONTROL_REGISTRY_PREFIX_WATCHER_H_
#define KVRAIL_CONTROL_REGISTRY_PREFIX_WATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "control/registry/etcd_client.h"
#include "control/registry/outage_log.h"

namespace httplib {
class Client;
}

namespace kvrail::registry {

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  std::string key;
  std::string value;  // empty for kDelete
  int64_t mod_revision = 0;
};

class PrefixWatcher {
  // Called on the watcher's thread, one event at a time, in revision order. It must not call
  // Stop.
 public:
  using Handler = std::function<void(const WatchEvent&)>;

  // Lists `prefix` at `endpoint` (Unavailable naming the endpoint when etcd does not answer),
  // hands every key found to `handler` as a kPut before it returns, then watches from a thread.
  static absl::StatusOr<std::unique_ptr<PrefixWatcher>> Start(
      const std::string& endpoint, const std::string& prefix, Handler handler,
      absl::Duration reconnect_every = absl::Milliseconds(500));
  ~PrefixWatcher();  // Stop()
  PrefixWatcher(const PrefixWatcher&) = delete;
  PrefixWatcher& operator=(const PrefixWatcher&) = delete;

  // Ends the stream (within `reconnect_every`) and joins the thread. Idempotent.
  void Stop();

  // Streams opened so far (for tests).
  uint64_t streams_opened() const { return streams_.load(); }
  // Lists of the prefix so far, the one at Start included (for tests).
  uint64_t relists() const { return relists_.load(); }

 private:
  PrefixWatcher(const std::string& endpoint, std::string prefix, Handler handler,
                absl::Duration reconnect_every);
  // Lists the prefix and hands on what differs from `known_`; returns the revision listed.
  absl::StatusOr<int64_t> Relist();
  // One watch stream from `next_revision_`; returns when it ends.
  absl::Status Stream();
  // Handles one line of the stream; false when the watch was cancelled (compaction).
  bool HandleLine(const std::string& line);
  void Deliver(const WatchEvent& event);
  void Run();

  const std::string endpoint_;
  const std::string prefix_;
  const Handler handler_;
  const absl::Duration reconnect_every_;
  EtcdClient client_;  // Relist's
  std::unique_ptr<httplib::Client> stream_client_;
  OutageLog outage_;
  // The watcher thread's own.
  std::map<std::string, int64_t> known_;  // key -> mod revision handed on
  int64_t next_revision_ = 0;
  bool need_relist_ = false;

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> streams_{0};
  std::atomic<uint64_t> relists_{0};
  std::thread thread_;
};

}  // namespace kvrail::registry

#endif  // KVRAIL_CONTROL_REGISTRY_PREFIX_WATCHER_H_
