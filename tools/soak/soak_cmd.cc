#include "tools/soak/soak_cmd.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/base/error.h"
#include "tools/renamed_flag.h"
#include "tools/soak/soak.h"

namespace kvrail::soak {
namespace {

// "2m", "90s", "1h30m" (absl::ParseDuration; a bare number is seconds).
bool ParseSeconds(const std::string& text, absl::Duration& out) {
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds)) {
    out = absl::Seconds(seconds);
    return true;
  }
  return absl::ParseDuration(text, &out);
}

}  // namespace

void AddSoak(CLI::App& app, int& exit_code) {
  static SoakOptions options;
  static std::string duration = "2m", epoch = "1m", fault_interval = "8s", deadline = "45s",
                     protocol_timeout = "20s";
  static int64_t rss_slack_mib = options.rss_slack_kib / 1024;
  CLI::App* sub = app.add_subcommand(
      "soak",
      "Real processes for a set time under faults (aborts, engine restarts, sidecar kills), "
      "every byte and event checked, memory, fds and tables held flat");
  sub->add_option("--duration", duration, "How long: 2m, 30m, 90s, ...")->capture_default_str();
  sub->add_option("--epoch", epoch, "Each epoch a new cluster of a random TP shape")
      ->capture_default_str();
  sub->add_option("--seed", options.seed, "The random draws (0: drawn, and printed)")
      ->capture_default_str();
  sub->add_option("--link", options.link,
                  "What carries the bytes between the ranks: shm or tcp (UCX shared memory, UCX "
                  "tcp on loopback)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp"}));
  tools::AddRenamedFlag(sub, "--transport", "--link (shm or tcp)");
  sub->add_option("--concurrency", options.concurrency, "Rooms in flight")->capture_default_str();
  sub->add_option("--min-prompt", options.min_prompt, "Shortest prompt, tokens")
      ->capture_default_str();
  sub->add_option("--max-prompt", options.max_prompt, "Longest prompt, tokens")
      ->capture_default_str();
  sub->add_option("--faults", options.faults,
                  "Faults to inject: prefill-aborts, decode-aborts, engine-restarts, "
                  "sidecar-kills (comma-separated; \"none\" for none)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--abort-fraction", options.abort_fraction,
                  "Rooms aborted by one of their engines")
      ->capture_default_str();
  sub->add_option("--fault-interval", fault_interval,
                  "Mean time between process faults (engine-sim restarts, prefill sidecar "
                  "kills); 0: none")
      ->capture_default_str();
  sub->add_option("--room-deadline", deadline, "A room must end everywhere within this")
      ->capture_default_str();
  sub->add_option("--protocol-timeout", protocol_timeout,
                  "The sidecars' CachePD bootstrap and waiting timeouts (§7.4)")
      ->capture_default_str();
  sub->add_option("--rss-slack", rss_slack_mib,
                  "MiB a sidecar's anonymous RSS may grow over an epoch, past its baseline")
      ->capture_default_str();
  sub->add_option("--log-dir", options.log_dir,
                  "Where the processes' stderr goes (default: a new /tmp/kvrail-soak-* dir)");
  sub->callback([&exit_code] {
    const auto fail = [&exit_code](const std::string& message) {
      std::fprintf(stderr, "error: soak: %s\n", message.c_str());
      exit_code = 1;
    };
    if (!ParseSeconds(duration, options.duration) || !ParseSeconds(epoch, options.epoch) ||
        !ParseSeconds(fault_interval, options.fault_interval) ||
        !ParseSeconds(deadline, options.room_deadline) ||
        !ParseSeconds(protocol_timeout, options.protocol_timeout)) {
      fail(absl::StrCat("--duration ", duration, ", --epoch ", epoch, ", --fault-interval ",
                        fault_interval, ", --room-deadline ", deadline, ", --protocol-timeout ",
                        protocol_timeout, ": each must be a duration such as 90s, 2m or 1h30m"));
      return;
    }
    options.rss_slack_kib = rss_slack_mib * 1024;
    if (options.faults == std::vector<std::string>{"none"}) options.faults.clear();
    std::error_code error;
    options.kvrail = std::filesystem::read_symlink("/proc/self/exe", error).string();
    if (error) options.kvrail = "kvrail";
    const absl::Status status = RunSoak(options);
    if (!status.ok()) {
      fail(std::string(status.message()));
      return;
    }
    exit_code = 0;
  });
}

}  // namespace kvrail::soak
