// The CachePD inbox and the ticker: timeouts, heartbeats, fence waits, and the prefill's
// re-registration with a bootstrap server that came back (sidecar_impl.h).
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"
#include "control/error/error.h"
#include "control/sidecar/sidecar_impl.h"

namespace kvrail::sidecar {
namespace {

// One quick /health probe (CACHEPD §1.6): the caller counts failures.
bool Healthy(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> server = SplitHostPort(address, "bootstrap");
  if (!server.ok()) return false;
  bootstrap::BootstrapClientOptions quick;
  quick.retries = 0;
  quick.connect_timeout = std::chrono::milliseconds(500);
  quick.read_timeout = std::chrono::milliseconds(1000);
  quick.deadline = std::chrono::milliseconds(1500);
  return bootstrap::BootstrapClient(server->first, server->second, quick).Health().ok();
}

}  // namespace

void Sidecar::Impl::InboxLoop() {
  while (!stop.load()) {
    absl::StatusOr<std::optional<std::vector<std::string>>> message =
        inbox->Receive(absl::Milliseconds(100));
    if (!message.ok()) {
      if (message.status().code() == absl::StatusCode::kInvalidArgument) {
        Locked locked(*this);
        ++stats.peer_messages_rejected;
        spdlog::warn("{}: peer message dropped: {}", role_name,
                     std::string(message.status().message()));
        continue;
      }
      return;
    }
    if (!message->has_value()) continue;
    Locked locked(*this);
    ++stats.peer_messages;
    if (!attached) {
      ++stats.peer_messages_rejected;
      spdlog::warn("{}: peer message before the engine attached its arena: dropped", role_name);
      continue;
    }
    const absl::Time now = absl::Now();
    absl::Status rejected;
    if (prefill) {
      session::PrefillOutput out = prefill->OnMessage(**message, now);
      rejected = out.rejected;
      ApplyLocked(std::move(out));
    } else {
      session::DecodeOutput out = decode->OnMessage(**message, now);
      rejected = out.rejected;
      ApplyLocked(std::move(out));
    }
    if (!rejected.ok()) {
      ++stats.peer_messages_rejected;
      spdlog::warn("{}: peer message refused: {}", role_name, DescribeError(rejected));
    }
  }
}

void Sidecar::Impl::TickerLoop() {
  absl::Time next_heartbeat = absl::Now();
  const absl::Duration interval = session::EffectiveHeartbeatInterval(options.timeouts);
  bool bootstrap_up = true;  // the prefill's bootstrap, as last probed
  while (!stop.load()) {
    absl::SleepFor(absl::Milliseconds(50));
    std::vector<std::string> probe;
    bool probe_own_bootstrap = false;
    {
      Locked locked(*this);
      if (!attached) continue;
      const absl::Time now = absl::Now();
      if (prefill) {
        ApplyLocked(prefill->Tick(now));
      } else {
        ApplyLocked(decode->Tick(now));
      }
      if (now >= next_heartbeat) {
        if (decode) probe = decode->BootstrapAddresses();
        probe_own_bootstrap = prefill.has_value();
        next_heartbeat = now + interval;
      }
    }
    for (const std::string& address : probe) {  // HTTP, so outside the lock
      const bool ok = Healthy(address);
      Locked locked(*this);
      if (decode) ApplyLocked(decode->OnHealth(address, ok, absl::Now()));
    }
    if (probe_own_bootstrap) {
      // A bootstrap server that restarted has forgotten this rank: once it answers again,
      // register again (an identical registration changes nothing, CACHEPD §2.1).
      const bool up = Healthy(options.bootstrap);
      if (up && !bootstrap_up) {
        std::lock_guard<std::mutex> attach_lock(attach_mu);
        if (registration) {
          const absl::Status again = RegisterWithBootstrap();
          if (again.ok()) {
            spdlog::info("prefill rank {}: registered again with bootstrap {}", options.tp_rank,
                         options.bootstrap);
          } else {
            spdlog::warn("prefill rank {}: registering again with bootstrap {}: {}",
                         options.tp_rank, options.bootstrap, DescribeError(again));
            continue;  // bootstrap_up stays false: try again at the next probe
          }
        }
      }
      if (!up && bootstrap_up) {
        spdlog::warn("prefill rank {}: bootstrap {} does not answer /health", options.tp_rank,
                     options.bootstrap);
      }
      bootstrap_up = up;
    }
  }
}

}  // namespace kvrail::sidecar
