#include "tools/top/scraper.h"

#include <httplib.h>

#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvrail::top {
namespace {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::steady_clock;

absl::StatusOr<Exposition> Fetch(const Target& target, const ScrapeLimits& limits) {
  httplib::Client http(target.host, target.port);
  const auto seconds = duration_cast<std::chrono::seconds>(limits.timeout);
  const auto usec = duration_cast<microseconds>(limits.timeout - seconds);
  http.set_connection_timeout(seconds.count(), usec.count());
  http.set_read_timeout(seconds.count(), usec.count());
  http.set_write_timeout(seconds.count(), usec.count());
  const steady_clock::time_point deadline = steady_clock::now() + limits.timeout;
  std::string body;
  std::string cut;  // why the body was cut short
  httplib::Result result = http.Get(target.path, [&](const char* data, size_t length) {
    if (steady_clock::now() > deadline) {
      cut = absl::StrCat("the answer took longer than ", limits.timeout.count(), " ms");
      return false;
    }
    if (body.size() + length > limits.max_body_bytes) {
      cut = absl::StrCat("the answer is over ", limits.max_body_bytes, " bytes");
      return false;
    }
    body.append(data, length);
    return true;
  });
  if (!cut.empty()) return absl::UnavailableError(cut);
  if (!result) {
    const httplib::Error error = result.error();
    const bool timed_out =
        error == httplib::Error::Read || error == httplib::Error::ConnectionTimeout;
    return absl::UnavailableError(
        timed_out ? absl::StrCat("no answer within ", limits.timeout.count(),
                                 " ms (httplib: ", httplib::to_string(error), ")")
                  : absl::StrCat("cannot reach it (httplib: ", httplib::to_string(error), ")"));
  }
  if (result->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET ", target.path, " answered HTTP ", result->status));
  }
  absl::StatusOr<Exposition> exposition = ParseExposition(body);
  if (!exposition.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed metrics: ", exposition.status().message()));
  }
  return exposition;
}

}  // namespace

double SteadySeconds() {
  return std::chrono::duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::vector<Scrape> ScrapeAll(const std::vector<Target>& targets, const ScrapeLimits& limits) {
  std::vector<Scrape> scrapes(targets.size());
  std::vector<std::thread> threads;
  threads.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    // Each thread writes its own slot only; join() publishes it.
    threads.emplace_back([&targets, &limits, &scrapes, i] {
      scrapes[i].endpoint = targets[i].name;
      scrapes[i].exposition = Fetch(targets[i], limits);
      scrapes[i].at_seconds = SteadySeconds();
    });
  }
  for (std::thread& thread : threads) thread.join();
  return scrapes;
}

}  // namespace kvrail::top
