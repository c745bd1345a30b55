#include "engine/metrics/registry.h"

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvrail::metrics {
namespace {

TEST(RegistryTest, WithReturnsTheSameSeriesForTheSameLabels) {
  Registry registry;
  Family<Counter>& bytes = registry.AddCounter("kvrail_bytes_total", "Bytes", {"peer", "lane"});
  bytes.With({"a:1", "0"}).Add(10);
  bytes.With({"a:1", "0"}).Add(5);
  bytes.With({"a:1", "1"}).Add(1);
  EXPECT_EQ(bytes.With({"a:1", "0"}).value(), 15u);
  EXPECT_EQ(bytes.With({"a:1", "1"}).value(), 1u);
}

TEST(RegistryTest, GaugesGoUpAndDown) {
  Gauge gauge;
  gauge.Set(4);
  gauge.Add(-1.5);
  EXPECT_DOUBLE_EQ(gauge.value(), 2.5);
}

TEST(RegistryTest, ClearRemovesEverySeries) {
  Registry registry;
  Family<Gauge>& last = registry.AddGauge("kvrail_last_failure_info", "Last", {"room"});
  last.With({"1"}).Set(1);
  last.Clear();
  last.With({"2"}).Set(2);
  const std::vector<MetricFamily> families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  ASSERT_EQ(families[0].samples.size(), 1u);
  EXPECT_EQ(families[0].samples[0].labels[0].second, "2");
}

TEST(RegistryTest, RemoveWhereDropsTheSeriesOfOneLabelValueAndSharedOnesStayUsable) {
  Registry registry;
  Family<Counter>& bytes = registry.AddCounter("kvrail_test_bytes_total", "test", {"peer", "lane"});
  bytes.With({"a", "0"}).Add(1);
  std::shared_ptr<Counter> held = bytes.Share({"b", "0"});
  bytes.With({"b", "1"}).Add(2);
  bytes.RemoveWhere(0, "b");
  held->Add(5);  // a transfer still in flight counts into a series nobody scrapes any more
  int series = 0;
  bytes.ForEach([&](const Labels& labels, const Counter&) {
    ++series;
    EXPECT_EQ(labels[0].second, "a");
  });
  EXPECT_EQ(series, 1);
  EXPECT_EQ(held->value(), 5);
}

TEST(RegistryTest, CollectorsAddTheirFamiliesAtEachCollect) {
  Registry registry;
  int calls = 0;
  registry.AddCollector([&calls](std::vector<MetricFamily>& out) {
    ++calls;
    out.push_back({"kvrail_table_entries",
                   "Entries",
                   MetricType::kGauge,
                   {{"", {{"table", "rooms"}}, static_cast<double>(calls)}}});
  });
  registry.Collect();
  const std::vector<MetricFamily> families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].samples[0].value, 2);
}

TEST(RegistryTest, HistogramCountsEachObservationInOneBucket) {
  Histogram histogram({1, 0.5});  // sorted on construction
  histogram.Observe(0.2);
  histogram.Observe(0.7);
  histogram.Observe(9);
  EXPECT_EQ(histogram.bucket_counts(), (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(histogram.count(), 3u);
  EXPECT_DOUBLE_EQ(histogram.sum(), 9.9);
}

// A collector may wait on another thread that uses the same registry meanwhile (a sidecar's
// stats come from its owner thread, which counts into the registry): the collectors run after
// the registry's lock is released, so neither waits for the other.
TEST(RegistryTest, ACollectorMayWaitOnAThreadThatAddsToTheSameRegistry) {
  Registry registry;
  registry.AddCollector([&registry](std::vector<MetricFamily>& out) {
    std::thread other([&registry] { registry.AddCounter("kvrail_added_total", "added").With(); });
    other.join();
    out.push_back({"kvrail_waited", "waited", MetricType::kGauge, {{"", {}, 1}}});
  });
  const std::vector<MetricFamily> families = registry.Collect();
  EXPECT_EQ(families.back().name, "kvrail_waited");
  // The counter the other thread added is there at the next collect.
  bool added = false;
  for (const MetricFamily& family : registry.Collect())
    added |= family.name == "kvrail_added_total";
  EXPECT_TRUE(added);
}

}  // namespace
}  // namespace kvrail::metrics
