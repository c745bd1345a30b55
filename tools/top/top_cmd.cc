#include "tools/top/top_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tools/top/frame_json.h"
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
  double interval = 1.0;  // seconds
  double timeout = 0;     // seconds; 0: the interval, at most 1 s
  bool once = false;
  bool json = false;
};

milliseconds Millis(double seconds) { return milliseconds(static_cast<int64_t>(seconds * 1000)); }

std::string ClockText() {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone());
}

// --once: two scrapes an interval apart, so that rates exist, and one frame on stdout.
int RunOnce(const TopOptions& options, const std::vector<Target>& targets,
            const top::ScrapeLimits& limits) {
  const double start = top::SteadySeconds();
  std::vector<Scrape> previous = top::ScrapeAll(targets, limits);
  const double left = options.interval - (top::SteadySeconds() - start);
  if (left > 0) std::this_thread::sleep_for(Millis(left));
  top::TopModel model = top::BuildModel(previous, top::ScrapeAll(targets, limits));
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
int RunLive(const TopOptions& options, const std::vector<Target>& targets,
            const top::ScrapeLimits& limits) {
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
    std::vector<Scrape> current = top::ScrapeAll(targets, limits);
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
      ->delimiter(',')
      ->required();
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
    top::ScrapeLimits limits;
    limits.timeout =
        Millis(options.timeout > 0 ? options.timeout : std::min(options.interval, 1.0));
    exit_code =
        options.once ? RunOnce(options, targets, limits) : RunLive(options, targets, limits);
  });
}

}  // namespace kvrail::tools
