// The Prometheus scrape endpoint: GET /metrics answers the text exposition
// (engine/metrics/exposition.h, content type "text/plain; version=0.0.4; charset=utf-8"); every
// other path is 404 and every other method 405. Off unless an operator asks for it
// (`--metrics-port`), bound to the host the operator names (127.0.0.1 by default).
//
// Bounded: a small pool of worker threads answers, and a connection that sends or reads
// nothing for `io_timeout` is closed, so a slow scraper holds a worker that long at most.
#ifndef KVRAIL_CONTROL_METRICS_HTTP_METRICS_SERVER_H_
#define KVRAIL_CONTROL_METRICS_HTTP_METRICS_SERVER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace kvrail::metrics {
class Registry;
}

namespace kvrail::metrics_http {

struct MetricsServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks a free port
  size_t threads = 2;
  std::chrono::seconds io_timeout{5};
};

class MetricsServer {
 public:
  // Binds host:port and serves `render` (called on a worker thread per scrape; must be
  // thread-safe and must not block for long) until destroyed. Unavailable, naming the address,
  // when it cannot be bound; InvalidArgument for a port outside 0..65535.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsServerOptions& options,
                                                              std::function<std::string()> render);
  // Serves `registry`'s exposition (Registry::Expose), which must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsServerOptions& options,
                                                              const metrics::Registry& registry);
  ~MetricsServer();  // stops serving and joins its threads
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "host:port", as a scrape target.
  std::string address() const;

 private:
  MetricsServer() = default;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
};

}  // namespace kvrail::metrics_http

#endif  // KVRAIL_CONTROL_METRICS_HTTP_METRICS_SERVER_H_
