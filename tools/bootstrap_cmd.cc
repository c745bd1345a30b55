#include "tools/bootstrap_cmd.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "control/bootstrap/bearer_token.h"
#include "control/bootstrap/registration.h"
#include "control/bootstrap/server.h"
#include "control/bootstrap/server_metrics.h"
#include "control/layout/revision.h"
#include "control/metrics_http/metrics_server.h"
#include "control/registry/bootstrap_store.h"
#include "control/registry/metrics_entry.h"
#include "control/session/peer_log_limiter.h"
#include "engine/base/error.h"
#include "tools/config_file.h"
#include "tools/json_log_format.h"
#include "tools/renamed_flag.h"

namespace kvrail::tools {
namespace {

using session::PeerLogLimiter;
using std::chrono::milliseconds;

// How long the ready line waits for the node description's first write to etcd.
constexpr absl::Duration kNodeWriteDeadline = absl::Seconds(5);

std::shared_ptr<spdlog::logger> MakeLogger(const std::string& log_format) {
  auto logger = std::make_shared<spdlog::logger>("bootstrap",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  if (log_format == "json") {
    logger->set_formatter(std::make_unique<JsonLogFormatter>("bootstrap", -1));
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e level=%l %v");
  }
  logger->flush_on(spdlog::level::info);
  return logger;
}

// `text` in double quotes, with quotes, backslashes and control bytes escaped: one log line.
std::string Quoted(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

std::string HeldBack(const PeerLogLimiter::Verdict& verdict) {
  return verdict.held_back == 0 ? "" : absl::StrCat(" held_back=", verdict.held_back);
}

// One key=value line per accepted PUT /route; a refused one at most once per peer address per
// interval (a peer can send as many as it likes).
void LogRegistration(spdlog::logger& logger, PeerLogLimiter& limiter,
                     const bootstrap::RegistrationEvent& event) {
  if (!event.status.ok()) {
    const PeerLogLimiter::Verdict verdict =
        limiter.Admit(event.peer.ip, PeerLogLimiter::Clock::now());
    if (!verdict.log) return;
    logger.warn("event=registration_refused http_status={} peer={} reason={}{}", event.http_status,
                event.peer.ToString(), Quoted(event.status.message()), HeldBack(verdict));
    return;
  }
  const bootstrap::PrefillRegistration& r = *event.registration;
  const bootstrap::RegistrationOutcome& o = event.outcome;
  if (!o.recorded) {
    logger.info("event=registration_not_filed role={} engine_rank={} peer={}", Quoted(r.role),
                r.engine_rank, event.peer.ToString());
    return;
  }
  const std::string replaced =
      o.replaced ? absl::StrCat(" replaced=", o.replaced->rank_ip, ":", o.replaced->rank_port) : "";
  logger.info(
      "event=registered engine_rank={} dp_group={} rank_in_group={} rank_ip={} rank_port={} "
      "registered={}/{} peer={}{}",
      r.engine_rank, o.dp_group, o.rank_in_group, r.endpoint.rank_ip, r.endpoint.rank_port,
      o.registered_ranks, o.world_size, event.peer.ToString(), replaced);
}

// A request or connection the server refused before any handler saw it (intake.h).
void LogRefusal(spdlog::logger& logger, PeerLogLimiter& limiter,
                const bootstrap::RefusalEvent& event) {
  const PeerLogLimiter::Verdict verdict =
      limiter.Admit(event.peer.ip, PeerLogLimiter::Clock::now());
  if (!verdict.log) return;
  logger.warn("event=request_refused kind={} http_status={} peer={} reason={}{}",
              std::string(bootstrap::RefusalKindName(event.kind)), event.http_status,
              event.peer.ToString(), Quoted(event.reason), HeldBack(verdict));
}

std::chrono::milliseconds Milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot be read"));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// The server's options from the command's: the bounds, the bearer token, the configured node.
absl::StatusOr<bootstrap::BootstrapServerOptions> ServerOptions(const BootstrapOptions& options) {
  bootstrap::BootstrapServerOptions out;
  out.max_connections = options.max_connections;
  out.request_deadline = Milliseconds(options.request_deadline_seconds);
  out.max_body_bytes = options.max_body_bytes;
  if (!options.bearer_token_file.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(out.bearer_token,
                            bootstrap::ReadBearerTokenFile(options.bearer_token_file));
  }
  out.cachepd_revision = layout::RevisionFromName(options.cachepd_revision);  // auto: nullopt
  if (options.world_size > 0) out.configured.world_size = options.world_size;
  if (options.dp_size > 0) out.configured.dp_size = options.dp_size;
  if (!options.cache_layout_file.empty()) {
    KVRAIL_ASSIGN_OR_RETURN(std::string wire,
                            ReadFile(options.cache_layout_file, "--cache-layout"));
    absl::StatusOr<std::string> canonical = bootstrap::CanonicalLayout(wire);
    if (!canonical.ok()) {
      return AddContext(canonical.status(),
                        absl::StrCat("--cache-layout ", options.cache_layout_file));
    }
    out.configured.canonical_layout = *std::move(canonical);
  }
  return out;
}

}  // namespace

int RunBootstrap(const BootstrapOptions& options) {
  // Block the stop signals before the server starts its threads, so every thread inherits the
  // mask and the signal is taken here, by sigtimedwait, and nowhere else. A shell starts background
  // jobs with SIGINT ignored, and an ignored signal is discarded instead of waiting for
  // sigtimedwait: restore the default disposition (never run, since the signals stay blocked).
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);

  auto fail = [&previous](const absl::Status& status) {
    const std::string message(status.message());
    std::fprintf(stderr, "error: %s\n", message.c_str());
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return 1;
  };
  absl::StatusOr<bootstrap::BootstrapServerOptions> server_options = ServerOptions(options);
  if (!server_options.ok()) return fail(server_options.status());

  std::shared_ptr<spdlog::logger> logger = MakeLogger(options.log_format);
  // The registry's threads log through spdlog's default logger: to stderr in this format too,
  // not onto stdout, which carries the ready line.
  spdlog::set_default_logger(logger);
  const milliseconds interval =
      std::max(Milliseconds(options.log_interval_seconds), milliseconds(1));
  auto limiter = std::make_shared<PeerLogLimiter>(interval);
  std::unique_ptr<registry::BootstrapStore> store;  // --registry
  bootstrap::BootstrapServer* serving = nullptr;    // for the node description, once made
  if (!options.registry.empty()) {
    auto opened = registry::BootstrapStore::Open(options.registry,
                                                 absl::Seconds(options.registry_ttl_seconds));
    if (!opened.ok()) return fail(opened.status());
    store = *std::move(opened);
  }
  server_options->on_registration = [logger, limiter, s = store.get(),
                                     &serving](const bootstrap::RegistrationEvent& event) {
    LogRegistration(*logger, *limiter, event);
    if (s == nullptr || !event.status.ok() || !event.registration) return;
    if (absl::StatusOr<std::string> body = bootstrap::SerializeRegistration(*event.registration);
        body.ok()) {
      s->Save(event.outcome.dp_group, event.outcome.rank_in_group, *body);
    }
    if (serving != nullptr) s->PublishNode(serving->SyncAnswer().dump());
  };
  const std::string bearer_token = server_options->bearer_token;
  server_options->on_refusal = [logger, limiter](const bootstrap::RefusalEvent& event) {
    LogRefusal(*logger, *limiter, event);
  };
  const bool bearer = !server_options->bearer_token.empty();
  bootstrap::BootstrapMetrics metrics;  // outlives the server, whose hooks count into it
  if (options.metrics_port >= 0) metrics.Hook(*server_options);
  bootstrap::BootstrapServer server(*std::move(server_options));
  serving = &server;
  absl::Status started = server.Start(options.host, options.port);
  if (!started.ok()) return fail(started);
  if (store) {  // what an earlier run on this address registered, replayed to this one
    absl::StatusOr<std::vector<std::string>> stored =
        store->Bind(registry::BootstrapAddress(options.host, server.port()));
    if (!stored.ok()) return fail(stored.status());
    for (const std::string& refused :
         registry::ReplayRegistrations(options.host, server.port(), bearer_token, *stored)) {
      logger->warn("event=registry_replay_refused error=\"{}\"", refused);
    }
    // The ready line promises the node can be found: wait for its description to be in etcd,
    // but not forever (etcd answered Open just now; if it went since, say so and go on: the
    // lease's thread keeps trying).
    store->PublishNode(server.SyncAnswer().dump());
    const bool node_written = store->AwaitNodeWritten(kNodeWriteDeadline);
    logger->info("event=registry_loaded registrations={} node_write={}", stored->size(),
                 node_written ? "done"
                              : absl::StrCat("pending waited_ms=",
                                             absl::ToInt64Milliseconds(kNodeWriteDeadline)));
  }
  std::unique_ptr<metrics_http::MetricsServer> metrics_server;  // --metrics-port
  if (options.metrics_port >= 0) {
    metrics.Watch(&server.registry());
    absl::StatusOr<std::unique_ptr<metrics_http::MetricsServer>> serving =
        metrics_http::MetricsServer::Start({options.metrics_host, options.metrics_port},
                                           metrics.registry());
    if (!serving.ok()) return fail(serving.status());
    metrics_server = *std::move(serving);
  }
  // --registry with --metrics-port: `kvrail top --registry` finds this server's row as it finds
  // the sidecars' (control/registry/metrics_entry.h).
  std::unique_ptr<registry::LeasePublisher> metrics_entry;
  if (store && metrics_server) {
    absl::StatusOr<std::unique_ptr<registry::LeasePublisher>> leased =
        registry::PublishBootstrapMetricsEntry(
            options.registry, absl::Seconds(options.registry_ttl_seconds),
            registry::BootstrapAddress(options.host, server.port()), metrics_server->address());
    if (!leased.ok()) return fail(leased.status());
    metrics_entry = *std::move(leased);
  }
  logger->info(
      "event=listening host={} port={} bearer_token={} max_connections={} request_deadline_ms={} "
      "cachepd_revision={}",
      options.host, server.port(), bearer ? "required" : "none", options.max_connections,
      Milliseconds(options.request_deadline_seconds).count(), options.cachepd_revision);
  // stdout carries one line for whoever started us (logs go to stderr), as the sidecar's
  // "sidecar ready" does: with --port 0 it is how a parent learns the port without racing
  // another process for one it picked.
  std::printf("bootstrap ready host=%s port=%d%s\n", options.host.c_str(), server.port(),
              metrics_server ? absl::StrCat(" metrics=", metrics_server->address()).c_str() : "");
  std::fflush(stdout);

  // Wait for a stop signal, and every log interval say what the limiter held back.
  timespec wait{};
  wait.tv_sec = static_cast<time_t>(interval.count() / 1000);
  wait.tv_nsec = static_cast<long>((interval.count() % 1000) * 1000000);
  int signal_number = 0;
  while (true) {
    signal_number = sigtimedwait(&stop_signals, nullptr, &wait);
    if (signal_number == SIGINT || signal_number == SIGTERM) break;
    for (const auto& [peer, count] : limiter->TakeHeldBack(PeerLogLimiter::Clock::now())) {
      logger->warn("event=refusals_held_back peer={} count={}", peer, count);
    }
  }
  logger->info("event=stopping signal={}", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  metrics_entry.reset();  // its lease revoked: the row goes at once
  metrics_server.reset();
  // The node entry goes; its registrations stay for the next run (those still queued are
  // written within a couple of seconds, or logged as lost).
  if (store) store->Stop();
  server.Stop();
  for (const auto& [peer, count] :
       limiter->TakeHeldBack(PeerLogLimiter::Clock::now() + interval)) {  // all that is left
    logger->warn("event=refusals_held_back peer={} count={}", peer, count);
  }
  logger->info("event=stopped");
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return 0;
}

void AddBootstrap(CLI::App& app, int& exit_code) {
  static BootstrapOptions options;
  CLI::App* command = app.add_subcommand(
      "bootstrap", "Run a prefill node's bootstrap server (CACHEPD §2) until SIGINT or SIGTERM");
  command->add_option("--port", options.port, "TCP port to listen on; 0 picks a free one")
      ->required()
      ->check(CLI::Range(0, 65535));
  command->add_option("--host", options.host, "Address to bind (default: every interface)");
  command
      ->add_option("--metrics-port", options.metrics_port,
                   "Serve GET /metrics (Prometheus text) on this port; 0 picks a free one "
                   "(default: off)")
      ->check(CLI::Range(0, 65535));
  command->add_option("--metrics-host", options.metrics_host, "The address --metrics-port binds")
      ->capture_default_str();
  AddRenamedFlag(command, "--token-file", "--bearer-token-file");
  command->add_option("--bearer-token-file", options.bearer_token_file,
                      "File holding the token PUT /route must carry as 'Authorization: Bearer "
                      "<token>' (default: none, as the reference)");
  command
      ->add_option("--world-size", options.world_size,
                   "The node's world size (tp x dp x pp); registrations that differ are "
                   "refused (default: the first registration's)")
      ->check(CLI::Range(1, bootstrap::kMaxWorldSize));
  command
      ->add_option("--dp-size", options.dp_size,
                   "The node's DP size; registrations that differ are refused (default: the "
                   "first registration's)")
      ->check(CLI::Range(1, bootstrap::kMaxWorldSize));
  command->add_option("--cache-layout", options.cache_layout_file,
                      "A contract file; registrations whose layout differs are refused "
                      "(default: the first registration's)");
  command
      ->add_option("--max-connections", options.max_connections,
                   "Open connections at most; past it the longest-open one still sending "
                   "its request is closed")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  command
      ->add_option("--request-deadline", options.request_deadline_seconds,
                   "Seconds from a connection's accept to its request's last byte")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  command
      ->add_option("--max-body-bytes", options.max_body_bytes,
                   "Largest request body; larger ones are refused 413 before they are read")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  command
      ->add_option("--log-interval", options.log_interval_seconds,
                   "Seconds: refusals are logged at most once per peer address per interval")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  command->add_option("--log-format", options.log_format, kLogFormatHelp)
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  command->add_option("--registry", options.registry,
                      "etcd://host:port: publish the node description there (leased) and keep "
                      "the registrations there, replayed when the server starts again on the "
                      "same address (default: off)");
  command
      ->add_option("--registry-ttl", options.registry_ttl_seconds,
                   "Seconds the registry keeps the node description after the server stops "
                   "renewing it")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
  command
      ->add_option(
          "--cachepd-revision", options.cachepd_revision,
          "The CachePD revision to speak: auto (both: PUT /route is accepted in the snapshot's "
          "and 2026-09's form, and the sync answer is 2026-09's, which snapshot decodes read "
          "too), or snapshot / 2026-09 to behave as a server of that revision alone: snapshot "
          "answers the sync with its three members and refuses 2026-09 contracts; 2026-09 "
          "refuses snapshot-era registrations with 500 (interop tests; CACHEPD §12.11)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "snapshot", "2026-09"}));
  AddConfigFile(command, std::cout);  // every flag above, and any added below, is a key
  command->callback([&exit_code]() { exit_code = RunBootstrap(options); });
}

}  // namespace kvrail::tools
