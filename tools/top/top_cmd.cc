#include "tools/top/top_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "control/registry/etcd_client.h"
#include "control/registry/keys.h"
#include "tools/top/frame_json.h"
#include "tools/top/registry_targets.h"
#include "tools/top/render.h"
#include "tools/top/scraper.h"
#include "tools/top/terminal.h"
#include "tools/top/view_model.h"

namespace kvrail::tools {
namespace {

using std::chrono::milliseconds;
using top::FrameOptions;
using top::Scrape;
using top::Target;
using top::Terminal;

struct TopOptions {
  std::vector<std::string> endpoints;
  std::string registry;   // etcd://host:port: also every endpoint listed under /kvrail/v1/metrics/
  double interval = 1.0;  // seconds
  double timeout = 0;     // seconds; 0: the interval, at most 1 s
  bool once = false;
  bool json = false;
};

milliseconds Millis(double seconds) { return milliseconds(static_cast<int64_t>(seconds * 1000)); }

std::string ClockText() {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone());
}

// One refresh's scrapes: of the endpoints named on the command line and, with --registry, of
// those the registry lists now (so sidecars come and go), each once. A registry that does not
// answer, or an entry that names no usable URL, is a row of its own with the error.
class ScrapeRound {
 public:
  ScrapeRound(std::vector<Target> fixed, const TopOptions& options, top::ScrapeLimits limits)
      : fixed_(std::move(fixed)), registry_url_(options.registry), limits_(limits) {}

  absl::Status Open() {
    if (registry_url_.empty()) return absl::OkStatus();
    absl::StatusOr<std::string> endpoint = registry::ParseRegistryUrl(registry_url_);
    if (!endpoint.ok()) return endpoint.status();
    etcd_ = std::make_unique<registry::EtcdClient>(*endpoint,
                                                   absl::Milliseconds(limits_.timeout.count()));
    return absl::OkStatus();
  }

  std::vector<Scrape> operator()() {
    std::vector<Target> targets = fixed_;
    std::vector<Scrape> unusable;
    if (etcd_) List(targets, unusable);
    std::vector<Scrape> scrapes = top::ScrapeAll(targets, limits_);
    scrapes.insert(scrapes.end(), unusable.begin(), unusable.end());
    return scrapes;
  }

 private:
  void List(std::vector<Target>& targets, std::vector<Scrape>& unusable) {
    absl::StatusOr<std::vector<registry::KeyValue>> listed = etcd_->List(registry::kMetricsPrefix);
    if (!listed.ok()) {
      unusable.push_back(Scrape{registry_url_, listed.status(), top::SteadySeconds()});
      return;
    }
    std::vector<std::pair<std::string, std::string>> entries;
    for (const registry::KeyValue& kv : *listed) entries.emplace_back(kv.key, kv.value);
    for (top::ListedTarget& entry : top::TargetsFromMetricsEntries(entries)) {
      if (!entry.target.ok()) {
        unusable.push_back(Scrape{entry.key, entry.target.status(), top::SteadySeconds()});
        continue;
      }
      bool named = false;  // on the command line already, or listed twice
      for (const Target& target : targets) named = named || target.name == entry.target->name;
      if (!named) targets.push_back(*std::move(entry.target));
    }
  }

  std::vector<Target> fixed_;
  std::string registry_url_;
  top::ScrapeLimits limits_;
  std::unique_ptr<registry::EtcdClient> etcd_;
};

// --once: two scrapes an interval apart, so that rates exist, and one frame on stdout.
int RunOnce(const TopOptions& options, ScrapeRound& scrape) {
  const double start = top::SteadySeconds();
  std::vector<Scrape> previous = scrape();
  const double left = options.interval - (top::SteadySeconds() - start);
  if (left > 0) std::this_thread::sleep_for(Millis(left));
  top::TopModel model = top::BuildModel(previous, scrape());
  FrameOptions frame;
  frame.width = 1 << 20;  // a pipe or a file: no width to cut to
  frame.time = ClockText();
  frame.interval_seconds = options.interval;
  frame.interactive = false;
  if (options.json) {
    std::printf("%s\n", top::FrameJson(model, frame).c_str());
  } else {
    for (const std::string& line : top::RenderFrame(model, frame))
      std::printf("%s\n", line.c_str());
  }
  return 0;
}

// The live view, until q or a signal.
int RunLive(const TopOptions& options, ScrapeRound& scrape) {
  Terminal terminal;
  std::vector<Scrape> previous;
  FrameOptions frame;
  frame.interval_seconds = options.interval;
  top::TopModel model;
  auto draw = [&] {
    frame.width = terminal.width();
    frame.height = terminal.height();
    terminal.Draw(top::RenderFrame(model, frame));
  };
  while (true) {
    const double round = top::SteadySeconds();
    std::vector<Scrape> current = scrape();
    model = top::BuildModel(previous, current);
    previous = std::move(current);
    frame.time = ClockText();
    draw();
    while (true) {
      const double left = options.interval - (top::SteadySeconds() - round);
      if (left <= 0) break;
      Terminal::Event event = terminal.Wait(Millis(left));
      if (event == Terminal::Event::kQuit) return 0;
      if (event == Terminal::Event::kResize) draw();
    }
  }
}

}  // namespace

void AddTop(CLI::App& app, int& exit_code) {
  static TopOptions options;
  CLI::App* sub = app.add_subcommand(
      "top", "A live view of sidecars and bootstrap servers from their metrics endpoints");
  sub->add_option("--endpoints", options.endpoints,
                  "Metrics endpoints, comma-separated: host:port or http://host:port/path")
      ->delimiter(',');
  sub->add_option("--registry", options.registry,
                  "etcd://host:port: also show every sidecar that publishes its metrics there "
                  "(listed again at each refresh)");
  sub->add_option("--interval", options.interval, "Seconds between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--timeout", options.timeout,
                  "Seconds one endpoint may take to answer (default: the interval, at most 1)")
      ->check(CLI::Range(0.01, 60.0));
  sub->add_flag("--once", options.once,
                "Print one frame (two scrapes an interval apart) without escapes, and exit");
  sub->add_flag("--json", options.json, "With --once: print the frame's numbers as JSON");
  sub->callback([&exit_code] {
    std::vector<Target> targets;
    for (const std::string& endpoint : options.endpoints) {
      absl::StatusOr<Target> target = top::ParseTarget(endpoint);
      if (!target.ok()) {
        std::fprintf(stderr, "kvrail top: --endpoints: %s\n",
                     std::string(target.status().message()).c_str());
        exit_code = 1;
        return;
      }
      targets.push_back(*std::move(target));
    }
    if (options.json && !options.once) {
      std::fprintf(stderr, "kvrail top: --json needs --once (the live view is for a person)\n");
      exit_code = 1;
      return;
    }
    if (targets.empty() && options.registry.empty()) {
      std::fprintf(stderr,
                   "kvrail top: give --endpoints host:port,... or --registry "
                   "etcd://host:port (or both)\n");
      exit_code = 1;
      return;
    }
    top::ScrapeLimits limits;
    limits.timeout =
        Millis(options.timeout > 0 ? options.timeout : std::min(options.interval, 1.0));
    ScrapeRound scrape(std::move(targets), options, limits);
    if (absl::Status opened = scrape.Open(); !opened.ok()) {
      std::fprintf(stderr, "kvrail top: %s\n", std::string(opened.message()).c_str());
      exit_code = 1;
      return;
    }
    exit_code = options.once ? RunOnce(options, scrape) : RunLive(options, scrape);
  });
}

}  // namespace kvrail::tools
