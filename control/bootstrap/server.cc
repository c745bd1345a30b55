#include "control/bootstrap/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "control/bootstrap/python_json.h"
#include "control/bootstrap/refusal.h"
#include "control/bootstrap/registration.h"
#include "control/wire/python_int.h"

namespace kvrail::bootstrap {
namespace {

constexpr char kText[] = "text/plain";
constexpr char kJson[] = "application/json";
constexpr char kRoutePath[] = "/route";
constexpr char kHealthPath[] = "/health";

void Answer(httplib::Response& res, int status, const std::string& body, const char* type) {
  res.status = status;
  res.set_content(body, type);
}

void AnswerRefusal(httplib::Response& res, const absl::Status& status) {
  const std::string message(status.message());
  Answer(res, HttpStatusOf(status), message, kText);
}

void AnswerNotFound(httplib::Response& res) { Answer(res, 404, "404: Not Found", kText); }

// A method the path does not serve. aiohttp answers /route's with the handler's own text, typed
// as JSON (§2), and other routes with its default 405.
void AnswerMethodNotAllowed(const httplib::Request& req, httplib::Response& res) {
  if (req.path == kRoutePath) {
    Answer(res, 405, "Method not allowed", kJson);
  } else if (req.path == kHealthPath) {
    res.set_header("Allow", "GET,HEAD");
    Answer(res, 405, "405: Method Not Allowed", kText);
  } else {
    AnswerNotFound(res);
  }
}

// Python's int() of a query parameter; the reference raises (500) when it cannot read it.
absl::StatusOr<int64_t> QueryInt(const std::string& text, absl::string_view name) {
  absl::StatusOr<int64_t> value = wire::ParsePythonInt(text, std::numeric_limits<int64_t>::min(),
                                                       std::numeric_limits<int64_t>::max(), name);
  if (!value.ok()) {
    return Refuse(Refusal::kReferenceRaises,
                  absl::StrCat("route: ", name, " '", absl::CHexEscape(text),
                               "' is not an integer as Python int() reads it (CACHEPD §2.2)"));
  }
  return value;
}

void AnswerGetRoute(const PrefillRegistry& registry, const httplib::Request& req,
                    httplib::Response& res) {
  const std::string engine_rank = req.get_param_value("engine_rank");
  const std::string dp_group = req.get_param_value("target_dp_group");
  if (engine_rank.empty() || dp_group.empty()) {
    Answer(res, 400, "Missing inputs for bootstrap server.", kText);
    return;
  }
  absl::StatusOr<int64_t> rank = QueryInt(engine_rank, "engine_rank");
  if (!rank.ok()) return AnswerRefusal(res, rank.status());
  absl::StatusOr<int64_t> group = QueryInt(dp_group, "target_dp_group");
  if (!group.ok()) return AnswerRefusal(res, group.status());
  if (*rank == -1 && *group == -1) {
    Answer(res, 200, DumpPythonJson(registry.Describe().ToJson()), kJson);
    return;
  }
  absl::StatusOr<RankEndpoint> endpoint = registry.Lookup(*rank, *group);
  if (!endpoint.ok()) return AnswerRefusal(res, endpoint.status());
  nlohmann::ordered_json body;
  body["rank_ip"] = endpoint->rank_ip;
  body["rank_port"] = endpoint->rank_port;
  Answer(res, 200, DumpPythonJson(body), kJson);
}

void AnswerPutRoute(PrefillRegistry& registry, const BootstrapServerOptions& options,
                    const httplib::Request& req, httplib::Response& res) {
  RegistrationEvent event;
  event.peer = absl::StrCat(req.remote_addr, ":", req.remote_port);
  absl::StatusOr<ParsedRegistration> parsed = ParseRegistration(req.body);
  if (parsed.ok()) {
    absl::StatusOr<RegistrationOutcome> outcome = registry.Register(*parsed);
    if (outcome.ok()) {
      event.outcome = *outcome;
      event.registration = std::move(parsed->registration);
    } else {
      event.status = outcome.status();
    }
  } else {
    event.status = parsed.status();
  }
  event.http_status = HttpStatusOf(event.status);
  if (event.status.ok()) {
    Answer(res, 200, "OK", kText);
  } else {
    AnswerRefusal(res, event.status);
  }
  if (options.on_registration) options.on_registration(event);
}

}  // namespace

BootstrapServer::BootstrapServer(BootstrapServerOptions options) : options_(std::move(options)) {}

BootstrapServer::~BootstrapServer() { Stop(); }

absl::Status BootstrapServer::Start(const std::string& host, int port) {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (started_) return absl::FailedPreconditionError("bootstrap server: started already");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("bootstrap server: port ", port, " is outside 0..65535"));
  }
  auto http = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second server bind the same
  // port and silently split the registrations between the two.
  http->set_socket_options([this](socket_t sock) {
    listen_fd_ = sock;
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const size_t workers = std::max<size_t>(options_.worker_threads, 1);
  http->new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  http->set_payload_max_length(options_.max_body_bytes);
  http->set_keep_alive_max_count(1);
  http->set_keep_alive_timeout(options_.idle_timeout.count());
  http->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, const std::exception_ptr& error) {
        std::string what = "unknown exception";
        try {
          if (error) std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        Answer(res, 500, absl::StrCat("internal error: ", what), kText);
      });
  // Everything but GET (HEAD included) and PUT /route is answered here, before httplib reads a
  // body: httplib would otherwise wait for the body of a POST without Content-Length, and has
  // no handler table at all for some methods aiohttp's "*" route takes.
  http->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    const std::string& m = req.method;
    if (m == "GET" || (m == "HEAD" && req.path != kRoutePath) ||
        (m == "PUT" && req.path == kRoutePath)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    AnswerMethodNotAllowed(req, res);
    // The body, if any, stays unread: close the connection rather than parse it as a request.
    if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
      res.set_header("Connection", "close");
    }
    return httplib::Server::HandlerResponse::Handled;
  });
  http->Get(".*", [this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == kRoutePath) {
      AnswerGetRoute(registry_, req, res);
    } else if (req.path == kHealthPath) {
      Answer(res, 200, "OK", kText);  // §1.6: always 200 "OK"
    } else {
      AnswerNotFound(res);
    }
  });
  http->Put(kRoutePath, [this](const httplib::Request& req, httplib::Response& res) {
    AnswerPutRoute(registry_, options_, req, res);
  });

  const int bound =
      port == 0 ? http->bind_to_any_port(host) : (http->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    const int error = errno;
    return absl::UnavailableError(absl::StrCat("bootstrap server: cannot listen on ", host, ":",
                                               port, " (", std::strerror(error), ")"));
  }
  // httplib listens with a backlog of 5; every rank of a node registers at once at start-up
  // (§1.2), so widen it (listen() again on a listening socket only changes the backlog).
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  http_ = std::move(http);
  port_ = bound;
  started_ = true;
  thread_ = std::thread([this] {
    http_->listen_after_bind();
    listen_returned_ = true;
  });
  // httplib's stop() is a no-op until the listen loop runs; wait for it so Stop() always works.
  while (!http_->is_running() && !listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return absl::OkStatus();
}

void BootstrapServer::Stop() {
  std::lock_guard<std::mutex> lock(lifecycle_mu_);
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

}  // namespace kvrail::bootstrap
