#include "control/bootstrap/server.h"

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "control/bootstrap/bearer_token.h"
#include "control/bootstrap/client.h"
#include "control/bootstrap/python_json.h"
#include "control/bootstrap/refusal.h"
#include "control/bootstrap/registration.h"
#include "control/wire/python_int.h"
#include "engine/base/error.h"

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

void AnswerGetRoute(const BootstrapServer& server, const httplib::Request& req,
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
  // Beside the reference's bytes: the node's ranks are kvrail sidecars (client.h).
  res.set_header(kKvrailNodeHeader, "1");
  if (*rank == -1 && *group == -1) {
    Answer(res, 200, DumpPythonJson(server.SyncAnswer()), kJson);
    return;
  }
  absl::StatusOr<RankEndpoint> endpoint = server.registry().Lookup(*rank, *group);
  if (!endpoint.ok()) return AnswerRefusal(res, endpoint.status());
  nlohmann::ordered_json body;
  body["rank_ip"] = endpoint->rank_ip;
  body["rank_port"] = endpoint->rank_port;
  // Only for a rank that registered one: a tokenspeed-shaped node's answer stays the reference's.
  if (!endpoint->curve_public_key.empty()) body["curve_public_key"] = endpoint->curve_public_key;
  Answer(res, 200, DumpPythonJson(body), kJson);
}

absl::Status Unauthorized(const httplib::Request& req) {
  return Refuse(Refusal::kUnauthorized,
                absl::StrCat("registration: PUT /route must carry the header 'Authorization: "
                             "Bearer <token>' with the token this bootstrap server was started "
                             "with (--bearer-token-file), and this one ",
                             req.has_header(kAuthorizationHeader) ? "carries another"
                                                                  : "has no Authorization header"));
}

void AnswerPutRoute(PrefillRegistry& registry, const BootstrapServerOptions& options,
                    const httplib::Request& req, httplib::Response& res) {
  RegistrationEvent event;
  event.peer = PeerAddress{req.remote_addr, req.remote_port};
  const bool token_required = !options.bearer_token.empty();
  if (token_required &&
      !AuthorizationCarries(req.get_header_value(kAuthorizationHeader), options.bearer_token)) {
    event.status = Unauthorized(req);
    res.set_header("WWW-Authenticate", "Bearer");
  } else if (absl::StatusOr<ParsedRegistration> parsed =
                 ParseRegistration(req.body, options.cachepd_revision);
             !parsed.ok()) {
    event.status = parsed.status();
  } else {
    const Registrant from{event.peer.ip, token_required};
    absl::StatusOr<RegistrationOutcome> outcome = registry.Register(*parsed, from);
    if (outcome.ok()) {
      event.outcome = *outcome;
      event.registration = std::move(parsed->registration);
    } else {
      event.status = outcome.status();
    }
  }
  event.http_status = HttpStatusOf(event.status);
  if (event.status.ok()) {
    Answer(res, 200, "OK", kText);
  } else {
    AnswerRefusal(res, event.status);
  }
  if (options.on_registration) options.on_registration(event);
}

// What httplib refuses by itself (a request line or header it cannot parse, a target over
// 8 KiB) comes with no body; give it the one line every refusal has.
httplib::Server::HandlerResponse DescribeBareError(const httplib::Request&,
                                                   httplib::Response& res) {
  if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  const std::string why =
      res.status == 414 ? "request: the request target exceeds the 8192 bytes httplib reads"
      : res.status == 400
          ? "request: the request line or a header does not parse as HTTP/1.1 (RFC 9112 §3, §5)"
          : absl::StrCat("request: refused with ", res.status);
  Answer(res, res.status, why, kText);
  return httplib::Server::HandlerResponse::Handled;
}

constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// One whole request the intake read, as httplib reads a connection: reads come from its bytes
// (then end of stream), writes go to the socket until the answer deadline.
class WholeRequestStream final : public httplib::Stream {
 public:
  explicit WholeRequestStream(const WholeRequest& request) : request_(request) {}

  bool is_readable() const override { return offset_ < request_.bytes.size(); }
  bool is_writable() const override {
    return std::chrono::steady_clock::now() < request_.answer_deadline;
  }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.bytes.size() - offset_);
    std::memcpy(ptr, request_.bytes.data() + offset_, n);
    offset_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    // httplib answers "Expect: 100-continue" as its first write; the intake did already, to
    // get the body.
    const bool first = !written_;
    written_ = true;
    if (first && request_.continue_sent && absl::string_view(ptr, size) == kContinue) {
      return static_cast<ssize_t>(size);
    }
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::send(request_.fd, ptr + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
                              request_.answer_deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) return -1;  // the peer does not read its answer: given up on
        pollfd writable{request_.fd, POLLOUT, 0};
        ::poll(&writable, 1, static_cast<int>(std::min<int64_t>(left, 60000)));
        continue;
      }
      return -1;
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = request_.peer.ip;
    port = request_.peer.port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = request_.local.ip;
    port = request_.local.port;
  }
  socket_t socket() const override { return request_.fd; }

 private:
  const WholeRequest& request_;
  size_t offset_ = 0;
  bool written_ = false;
};

}  // namespace

// httplib's request parsing, routing and answer writing, over a request the intake read whole.
// With an on_request hook, httplib's logger (called once the answer is decided) reports it.
class HttpAnswerer : public httplib::Server {
 public:
  void Answer(const WholeRequest& request) {
    WholeRequestStream stream(request);
    bool connection_closed = false;
    started_ = std::chrono::steady_clock::now();
    process_request(stream, /*close_connection=*/true, connection_closed, nullptr);
  }

  void ReportTo(std::function<void(const RequestEvent&)> on_request) {
    if (!on_request) return;
    set_logger([on_request = std::move(on_request)](const httplib::Request& req,
                                                    const httplib::Response& res) {
      on_request({req.method, req.path, res.status, std::chrono::steady_clock::now() - started_});
    });
  }

 private:
  // Answer and the logger run on the same worker thread, one request at a time.
  static thread_local std::chrono::steady_clock::time_point started_;
};

thread_local std::chrono::steady_clock::time_point HttpAnswerer::started_;

namespace {

IntakeOptions IntakeOptionsOf(const BootstrapServerOptions& options) {
  IntakeOptions intake;
  intake.limits.max_body_bytes = options.max_body_bytes;
  intake.request_deadline = options.request_deadline;
  intake.max_connections = options.max_connections;
  intake.worker_threads = options.worker_threads;
  intake.on_refusal = options.on_refusal;
  return intake;
}

}  // namespace

BootstrapServer::BootstrapServer(BootstrapServerOptions options)
    : options_(std::move(options)),
      registry_(options_.configured),
      http_(std::make_unique<HttpAnswerer>()),
      intake_(IntakeOptionsOf(options_),
              [this](const WholeRequest& request) { http_->Answer(request); }) {
  HttpAnswerer& http = *http_;
  http.set_payload_max_length(options_.max_body_bytes);
  http.set_error_handler(httplib::Server::HandlerWithResponse(DescribeBareError));
  http.ReportTo(options_.on_request);
  http.set_exception_handler(
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
  // body, as it has no handler table at all for some methods aiohttp's "*" route takes.
  http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    const std::string& m = req.method;
    if (m == "GET" || (m == "HEAD" && req.path != kRoutePath) ||
        (m == "PUT" && req.path == kRoutePath)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    AnswerMethodNotAllowed(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.Get(".*", [this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == kRoutePath) {
      AnswerGetRoute(*this, req, res);
    } else if (req.path == kHealthPath) {
      Answer(res, 200, "OK", kText);  // §1.6: always 200 "OK"
    } else {
      AnswerNotFound(res);
    }
  });
  http.Put(kRoutePath, [this](const httplib::Request& req, httplib::Response& res) {
    AnswerPutRoute(registry_, options_, req, res);
  });
}

BootstrapServer::~BootstrapServer() { Stop(); }

absl::Status BootstrapServer::Start(const std::string& host, int port) {
  if (!options_.bearer_token.empty()) {
    KVRAIL_RETURN_IF_ERROR(ValidateBearerToken(options_.bearer_token));
  }
  return intake_.Start(host, port);
}

void BootstrapServer::Stop() { intake_.Stop(); }

nlohmann::ordered_json BootstrapServer::SyncAnswer() const {
  return registry_.Describe().ToJson(options_.cachepd_revision.value_or(layout::kNewestRevision));
}

}  // namespace kvrail::bootstrap
