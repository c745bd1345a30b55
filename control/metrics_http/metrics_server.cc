#include "control/metrics_http/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/metrics/exposition.h"
#include "engine/metrics/registry.h"
#include "engine/sync/thread_name.h"

namespace kvrail::metrics_http {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, std::function<std::string()> render) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-port ", options.port, ": a TCP port must be in 0..65535 (0 picks a free one)"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->host_ = options.host;
  server->server_ = std::make_unique<httplib::Server>();
  httplib::Server& http = *server->server_;
  const size_t threads = options.threads == 0 ? 1 : options.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_read_timeout(options.io_timeout.count(), 0);
  http.set_write_timeout(options.io_timeout.count(), 0);
  http.set_keep_alive_max_count(16);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // process bind the same port and take half the scrapes.
  http.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.Get("/metrics",
           [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
             res.set_content(render(), metrics::kContentType);
           });
  http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 405;
    res.set_content("405: only GET /metrics is served here\n", "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content(absl::StrCat("404: ", req.path, " is not served here: GET /metrics\n"),
                      "text/plain");
    }
  });
  const int port = options.port == 0
                       ? http.bind_to_any_port(options.host)
                       : (http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port < 0) {
    return absl::UnavailableError(absl::StrCat("--metrics-host/--metrics-port ", options.host, ":",
                                               options.port, ": cannot bind"));
  }
  server->port_ = port;
  MetricsServer* self = server.get();
  server->thread_ = std::thread([self, &http] {
    http.listen_after_bind();
    self->listen_returned_.store(true);
  });
  NameThread(server->thread_, "kvrail-metrics");  // httplib's request workers are its own, unnamed
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, const metrics::Registry& registry) {
  return Start(options, [&registry] { return registry.Expose(); });
}

MetricsServer::~MetricsServer() {
  // httplib's stop() does nothing before the listen loop runs: wait for it (or its failure).
  while (server_ && thread_.joinable() && !server_->is_running() && !listen_returned_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string MetricsServer::address() const {
  // An IPv6 host goes in brackets, as a scrape target needs.
  if (host_.find(':') != std::string::npos) return absl::StrCat("[", host_, "]:", port_);
  return absl::StrCat(host_, ":", port_);
}

}  // namespace kvrail::metrics_http
