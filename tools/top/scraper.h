// Fetching `GET /metrics` from many endpoints at once, each within a bounded time, so that one
// dead or slow endpoint shows as DOWN instead of stalling the view.
#ifndef KVRAIL_TOOLS_TOP_SCRAPER_H_
#define KVRAIL_TOOLS_TOP_SCRAPER_H_

#include <chrono>
#include <string>
#include <vector>

#include "tools/top/target.h"
#include "tools/top/view_model.h"

namespace kvrail::top {

struct ScrapeLimits {
  // Connect, each read, and the whole answer (checked as its body arrives).
  std::chrono::milliseconds timeout{1000};
  size_t max_body_bytes = 16 << 20;
};

// One scrape of each target, all at once (a thread each); returns when every one has answered,
// failed or run out of time, in the order of `targets`. `at_seconds` is each answer's time on
// the steady clock.
std::vector<Scrape> ScrapeAll(const std::vector<Target>& targets, const ScrapeLimits& limits);

// Seconds on the steady clock, the clock Scrape::at_seconds is on.
double SteadySeconds();

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_SCRAPER_H_
