// Counters, gauges and histograms with label sets, kept in a Registry and collected for the
// exposition (exposition.h). Pure: no sockets, threads or clocks; a caller measures durations
// itself and observes seconds.
//
// Updates are lock-free (atomics). A family's mutex is taken only when a labelled series is
// looked up (With: find or create) and when it is collected, so a hot path looks its series up
// once and keeps the reference: series live as long as their registry and never move.
// Collectors (AddCollector) are called at each Collect, for values read at scrape time (table
// sizes, counters another object keeps).
#ifndef KVRAIL_ENGINE_METRICS_REGISTRY_H_
#define KVRAIL_ENGINE_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/metrics/exposition.h"

namespace kvrail::metrics {

// A count that only goes up.
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value);
  void Add(double delta);
  double value() const;

 private:
  std::atomic<uint64_t> bits_{0};  // the double's bits: 0 is 0.0
};

// Observations counted into fixed buckets (upper bounds, ascending), with their sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative); the last is above every bound.
  std::vector<uint64_t> bucket_counts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_bits_{0};
};

// Bucket bounds for latencies, 100 us to 60 s.
std::vector<double> LatencyBuckets();

// One metric name's series, one per label set. `label_names` fixes the labels' names and
// order; With takes the values in that order.
template <typename Metric>
class Family {
 public:
  Family(std::vector<std::string> label_names, std::function<std::unique_ptr<Metric>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}

  // The series with these label values (as many as the label names), made on first use.
  Metric& With(const std::vector<std::string>& values = {}) { return *Share(values); }

  // The same, for a caller that may still count into it after the series was removed
  // (RemoveWhere): it lives as long as the caller holds it, unseen by scrapes.
  std::shared_ptr<Metric> Share(const std::vector<std::string>& values = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<Metric>& series = series_[values];
    if (!series) series = make_();
    return series;
  }

  // Removes every series: for a family that holds at most one, replaced as a whole.
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    series_.clear();
  }

  // Removes the series whose label `index` (in label-name order) is `value`: a peer that is
  // gone takes its series with it, so that peers coming and going grow nothing.
  void RemoveWhere(size_t index, const std::string& value) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = series_.begin(); it != series_.end();) {
      it = index < it->first.size() && it->first[index] == value ? series_.erase(it) : ++it;
    }
  }

  // Calls `visit(labels, metric)` for each series, under the family's lock.
  template <typename Visit>
  void ForEach(Visit visit) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [values, metric] : series_) {
      Labels labels;
      for (size_t i = 0; i < label_names_.size() && i < values.size(); ++i) {
        labels.emplace_back(label_names_[i], values[i]);
      }
      visit(labels, *metric);
    }
  }

 private:
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<Metric>()> make_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::shared_ptr<Metric>> series_;
};

class Registry {
 public:
  // Each returns a family that lives as long as the registry. Names must be unique in it.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds,
                                  std::vector<std::string> label_names = {});

  // `collect` is called by each Collect and appends families it reads at that moment.
  void AddCollector(std::function<void(std::vector<MetricFamily>&)> collect);

  // Every family, in the order added, then the collectors' families.
  std::vector<MetricFamily> Collect() const;
  // ExposeText(Collect()).
  std::string Expose() const;

 private:
  struct Entry {
    std::string name;
    std::string help;
    MetricType type;
    std::unique_ptr<Family<Counter>> counters;
    std::unique_ptr<Family<Gauge>> gauges;
    std::unique_ptr<Family<Histogram>> histograms;
  };
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<std::function<void(std::vector<MetricFamily>&)>> collectors_;
};

}  // namespace kvrail::metrics

#endif  // KVRAIL_ENGINE_METRICS_REGISTRY_H_
