#include "tools/top/view_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvrail::top {
namespace {

constexpr double kRoomQuantile = 0.99;

// A series' identity within its name: its labels, sorted, as one string.
std::string SeriesKey(const Sample& sample) {
  Labels labels = sample.labels;
  std::sort(labels.begin(), labels.end());
  std::string key;
  for (const auto& [name, value] : labels) absl::StrAppend(&key, name, "=", value, "\x1f");
  return key;
}

using SampleFilter = std::function<bool(const Sample&)>;

// For each series named `name` in `current` that `keep` accepts, the counter's increase since
// `previous` (a series that went down, or was absent, counts from zero); `add` gets each.
void ForEachIncrease(const Exposition& previous, const Exposition& current, absl::string_view name,
                     const SampleFilter& keep,
                     const std::function<void(const Sample&, double)>& add) {
  std::map<std::string, double> before;
  for (const Sample* sample : previous.Named(name)) before[SeriesKey(*sample)] = sample->value;
  for (const Sample* sample : current.Named(name)) {
    if (keep && !keep(*sample)) continue;
    auto it = before.find(SeriesKey(*sample));
    double increase = sample->value;
    if (it != before.end() && sample->value >= it->second) increase = sample->value - it->second;
    add(*sample, increase);
  }
}

double Increase(const Exposition& previous, const Exposition& current, absl::string_view name,
                const SampleFilter& keep = nullptr) {
  double total = 0;
  ForEachIncrease(previous, current, name, keep,
                  [&total](const Sample&, double increase) { total += increase; });
  return total;
}

double Sum(const Exposition& exposition, absl::string_view name,
           const SampleFilter& keep = nullptr) {
  double total = 0;
  for (const Sample* sample : exposition.Named(name)) {
    if (!keep || keep(*sample)) total += sample->value;
  }
  return total;
}

bool IsFailed(const Sample& sample) { return sample.Label("outcome") == "failed"; }

// The room-duration histogram's buckets, summed over label sets, as increases since
// `previous`.
std::vector<std::pair<double, double>> RoomDurationIncrease(const Exposition& previous,
                                                            const Exposition& current) {
  std::map<double, double> by_bound;
  ForEachIncrease(previous, current, "kvrail_room_duration_seconds_bucket", nullptr,
                  [&by_bound](const Sample& sample, double increase) {
                    double bound = 0;
                    std::string le = sample.Label("le");
                    if (le == "+Inf" || le == "Inf") {
                      bound = INFINITY;
                    } else if (!absl::SimpleAtod(le, &bound)) {
                      return;  // the parser checked it; a bound atod cannot read is skipped
                    }
                    by_bound[bound] += increase;
                  });
  return {by_bound.begin(), by_bound.end()};
}

std::optional<LastFailure> LastFailureOf(const Exposition& exposition) {
  std::optional<LastFailure> last;
  for (const Sample* sample : exposition.Named("kvrail_last_failure_info")) {
    if (last && last->unix_seconds >= sample->value) continue;
    last = LastFailure{sample->Label("cause"), sample->Label("room"), sample->Label("reason"),
                       sample->value};
  }
  return last;
}

void ViewIdentity(const Exposition& exposition, EndpointView& view) {
  std::vector<const Sample*> sidecar = exposition.Named("kvrail_sidecar_info");
  if (!sidecar.empty()) {
    view.kind = EndpointKind::kSidecar;
    view.role = sidecar[0]->Label("role");
    view.rank = sidecar[0]->Label("tp_rank");
    view.session = sidecar[0]->Label("session");
  } else if (!exposition.Named("kvrail_bootstrap_info").empty()) {
    view.kind = EndpointKind::kBootstrap;
    view.role = "bootstrap";
  }
}

void ViewRates(const Exposition& before, const Exposition& now, double seconds,
               EndpointView& view) {
  view.has_rates = true;
  view.rooms_per_second = Increase(before, now, "kvrail_rooms_total") / seconds;
  view.failures_per_second = Increase(before, now, "kvrail_rooms_total", IsFailed) / seconds;
  view.requests_per_second = Increase(before, now, "kvrail_bootstrap_requests_total") / seconds;
  std::map<std::string, double> per_peer;
  ForEachIncrease(before, now, "kvrail_bytes_total", nullptr,
                  [&per_peer](const Sample& sample, double increase) {
                    per_peer[sample.Label("peer")] += increase;
                  });
  for (const auto& [peer, bytes] : per_peer) {
    view.peers.push_back(PeerRate{peer, bytes / seconds});
    view.bytes_per_second += bytes / seconds;
  }
  std::stable_sort(view.peers.begin(), view.peers.end(), [](const PeerRate& a, const PeerRate& b) {
    return a.bytes_per_second > b.bytes_per_second;
  });
  view.p99_seconds = HistogramQuantile(kRoomQuantile, RoomDurationIncrease(before, now));
}

}  // namespace

std::optional<double> HistogramQuantile(double q, std::vector<std::pair<double, double>> buckets) {
  if (buckets.empty()) return std::nullopt;
  std::sort(buckets.begin(), buckets.end());
  // Buckets with the same bound (two spellings of one le) are one bucket.
  std::vector<std::pair<double, double>> merged;
  for (const auto& bucket : buckets) {
    if (!merged.empty() && merged.back().first == bucket.first) {
      merged.back().second += bucket.second;
    } else {
      merged.push_back(bucket);
    }
  }
  if (!std::isinf(merged.back().first) || merged.back().first < 0 || merged.size() < 2) {
    return std::nullopt;
  }
  // Cumulative counts never fall; deltas across a reset may, and Prometheus evens them out.
  for (size_t i = 1; i < merged.size(); ++i) {
    merged[i].second = std::max(merged[i].second, merged[i - 1].second);
  }
  const double observations = merged.back().second;
  if (observations <= 0) return std::nullopt;
  if (q < 0) return -INFINITY;
  if (q > 1) return INFINITY;
  double rank = q * observations;
  size_t b = 0;
  while (b < merged.size() - 1 && merged[b].second < rank) ++b;
  if (b == merged.size() - 1) return merged[merged.size() - 2].first;
  if (b == 0 && merged[0].first <= 0) return merged[0].first;
  double start = 0;
  double end = merged[b].first;
  double count = merged[b].second;
  if (b > 0) {
    start = merged[b - 1].first;
    count -= merged[b - 1].second;
    rank -= merged[b - 1].second;
  }
  return start + (end - start) * (rank / count);
}

EndpointView ViewEndpoint(const Scrape* previous, const Scrape& current) {
  EndpointView view;
  view.endpoint = current.endpoint;
  if (!current.exposition.ok()) {
    view.error = std::string(current.exposition.status().message());
    return view;
  }
  view.up = true;
  const Exposition& now = *current.exposition;
  ViewIdentity(now, view);
  view.failures = Sum(now, "kvrail_rooms_total", IsFailed);
  view.last_failure = LastFailureOf(now);
  view.bytes_in_flight = Sum(now, "kvrail_bytes_in_flight");
  view.registered_ranks = Sum(now, "kvrail_bootstrap_registered_ranks");
  const double seconds = previous == nullptr ? 0 : current.at_seconds - previous->at_seconds;
  if (previous != nullptr && previous->exposition.ok() && seconds > 0) {
    ViewRates(*previous->exposition, now, seconds, view);
  }
  return view;
}

TopModel BuildModel(const std::vector<Scrape>& previous, const std::vector<Scrape>& current) {
  TopModel model;
  for (const Scrape& scrape : current) {
    const Scrape* before = nullptr;
    for (const Scrape& candidate : previous) {
      if (candidate.endpoint == scrape.endpoint) before = &candidate;
    }
    EndpointView view = ViewEndpoint(before, scrape);
    Totals& t = model.totals;
    ++(view.up ? t.up : t.down);
    t.rooms_per_second += view.rooms_per_second;
    t.bytes_per_second += view.bytes_per_second;
    t.failures += view.failures;
    t.failures_per_second += view.failures_per_second;
    t.bytes_in_flight += view.bytes_in_flight;
    model.rows.push_back(std::move(view));
  }
  return model;
}

}  // namespace kvrail::top
