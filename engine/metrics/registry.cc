#include "engine/metrics/registry.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace kvrail::metrics {
namespace {

uint64_t Bits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double FromBits(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

void AddDouble(std::atomic<uint64_t>& bits, double delta) {
  uint64_t old = bits.load(std::memory_order_relaxed);
  while (!bits.compare_exchange_weak(old, Bits(FromBits(old) + delta), std::memory_order_relaxed)) {
  }
}

}  // namespace

void Gauge::Set(double value) { bits_.store(Bits(value), std::memory_order_relaxed); }
void Gauge::Add(double delta) { AddDouble(bits_, delta); }
double Gauge::value() const { return FromBits(bits_.load(std::memory_order_relaxed)); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  std::sort(bounds_.begin(), bounds_.end());
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // Prometheus buckets are "less than or equal": the first bound not below the value.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  AddDouble(sum_bits_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

double Histogram::sum() const { return FromBits(sum_bits_.load(std::memory_order_relaxed)); }

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  auto entry = std::make_unique<Entry>(Entry{name, help, MetricType::kCounter});
  entry->counters = std::make_unique<Family<Counter>>(std::move(label_names),
                                                      [] { return std::make_unique<Counter>(); });
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(std::move(entry));
  return *entries_.back()->counters;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  auto entry = std::make_unique<Entry>(Entry{name, help, MetricType::kGauge});
  entry->gauges = std::make_unique<Family<Gauge>>(std::move(label_names),
                                                  [] { return std::make_unique<Gauge>(); });
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(std::move(entry));
  return *entries_.back()->gauges;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds,
                                          std::vector<std::string> label_names) {
  auto entry = std::make_unique<Entry>(Entry{name, help, MetricType::kHistogram});
  entry->histograms = std::make_unique<Family<Histogram>>(
      std::move(label_names), [bounds] { return std::make_unique<Histogram>(bounds); });
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(std::move(entry));
  return *entries_.back()->histograms;
}

void Registry::AddCollector(std::function<void(std::vector<MetricFamily>&)> collect) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.push_back(std::move(collect));
}

std::vector<MetricFamily> Registry::Collect() const {
  std::vector<MetricFamily> out;
  // The collectors run after the lock is released: one may wait on its owner (a sidecar's
  // stats come from its owner thread), which may meanwhile count into this registry.
  std::vector<std::function<void(std::vector<MetricFamily>&)>> collectors;
  std::unique_lock<std::mutex> lock(mu_);
  collectors = collectors_;
  for (const auto& entry : entries_) {
    MetricFamily family{entry->name, entry->help, entry->type, {}};
    if (entry->counters) {
      entry->counters->ForEach([&](const Labels& labels, const Counter& counter) {
        family.samples.push_back({"", labels, static_cast<double>(counter.value())});
      });
    } else if (entry->gauges) {
      entry->gauges->ForEach([&](const Labels& labels, const Gauge& gauge) {
        family.samples.push_back({"", labels, gauge.value()});
      });
    } else {
      entry->histograms->ForEach([&](const Labels& labels, const Histogram& histogram) {
        // Read the buckets once: the cumulative counts and the +Inf bucket (= _count) agree.
        const std::vector<uint64_t> counts = histogram.bucket_counts();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          Labels with_le = labels;
          with_le.emplace_back(
              "le", i < histogram.bounds().size() ? FormatValue(histogram.bounds()[i]) : "+Inf");
          family.samples.push_back(
              {"_bucket", std::move(with_le), static_cast<double>(cumulative)});
        }
        family.samples.push_back({"_sum", labels, histogram.sum()});
        family.samples.push_back({"_count", labels, static_cast<double>(cumulative)});
      });
    }
    out.push_back(std::move(family));
  }
  lock.unlock();
  for (const auto& collect : collectors) collect(out);
  return out;
}

std::string Registry::Expose() const { return ExposeText(Collect()); }

}  // namespace kvrail::metrics
