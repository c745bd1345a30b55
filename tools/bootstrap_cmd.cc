#include "tools/bootstrap_cmd.h"

#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/server.h"

namespace kvrail::tools {
namespace {

std::shared_ptr<spdlog::logger> MakeLogger() {
  auto logger = std::make_shared<spdlog::logger>("bootstrap",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e level=%l %v");
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

// One key=value line per PUT /route.
void LogRegistration(spdlog::logger& logger, const bootstrap::RegistrationEvent& event) {
  if (!event.status.ok()) {
    logger.warn("event=registration_refused http_status={} peer={} reason={}", event.http_status,
                event.peer.ToString(), Quoted(event.status.message()));
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

}  // namespace

int RunBootstrap(const BootstrapOptions& options) {
  // Block the stop signals before the server starts its threads, so every thread inherits the
  // mask and the signal is taken here, by sigwait, and nowhere else. A shell starts background
  // jobs with SIGINT ignored, and an ignored signal is discarded instead of waiting for sigwait:
  // restore the default disposition (never run, since the signals stay blocked).
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);

  std::shared_ptr<spdlog::logger> logger = MakeLogger();
  bootstrap::BootstrapServerOptions server_options;
  server_options.on_registration = [logger](const bootstrap::RegistrationEvent& event) {
    LogRegistration(*logger, event);
  };
  bootstrap::BootstrapServer server(server_options);
  absl::Status started = server.Start(options.host, options.port);
  if (!started.ok()) {
    const std::string message(started.message());
    std::fprintf(stderr, "error: %s\n", message.c_str());
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return 1;
  }
  logger->info("event=listening host={} port={}", options.host, server.port());

  int signal_number = 0;
  while (sigwait(&stop_signals, &signal_number) != 0) {
  }
  logger->info("event=stopping signal={}", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
  server.Stop();
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
  command->callback([&exit_code]() { exit_code = RunBootstrap(options); });
}

}  // namespace kvrail::tools
