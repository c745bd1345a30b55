#include "tools/top/view_model.h"

#include <cmath>

#include "gtest/gtest.h"

namespace kvrail::top {
namespace {

// A decode sidecar's metrics after `rooms` rooms (`failed` of them failed), `bytes` landed
// from each of two peers over two lanes, and the room durations given as cumulative bucket
// counts for le = 0.01, 0.1, 1, +Inf.
std::string SidecarText(int ok, int failed, double bytes_a, double bytes_b,
                        const std::vector<int>& buckets) {
  std::string text =
      "# TYPE kvrail_sidecar_info gauge\n"
      "kvrail_sidecar_info{role=\"prefill\",tp_rank=\"1\",session=\"10.0.0.1:7000\","
      "version=\"0.1\"} 1\n"
      "# TYPE kvrail_rooms_total counter\n";
  text += "kvrail_rooms_total{outcome=\"succeeded\",cause=\"\"} " + std::to_string(ok) + "\n";
  if (failed > 0) {
    text +=
        "kvrail_rooms_total{outcome=\"failed\",cause=\"timeout\"} " + std::to_string(failed) + "\n";
  }
  text += "# TYPE kvrail_bytes_total counter\n";
  text += "kvrail_bytes_total{peer=\"a:1\",lane=\"0\"} " + std::to_string(bytes_a / 2) + "\n";
  text += "kvrail_bytes_total{peer=\"a:1\",lane=\"1\"} " + std::to_string(bytes_a / 2) + "\n";
  text += "kvrail_bytes_total{peer=\"b:2\",lane=\"0\"} " + std::to_string(bytes_b) + "\n";
  text += "# TYPE kvrail_room_duration_seconds histogram\n";
  const char* bounds[] = {"0.01", "0.1", "1", "+Inf"};
  for (int i = 0; i < 4; ++i) {
    text += std::string("kvrail_room_duration_seconds_bucket{le=\"") + bounds[i] + "\"} " +
            std::to_string(buckets[i]) + "\n";
  }
  text += "kvrail_room_duration_seconds_count " + std::to_string(buckets[3]) + "\n";
  text += "# TYPE kvrail_bytes_in_flight gauge\nkvrail_bytes_in_flight 4096\n";
  return text;
}

Scrape ScrapeOf(const std::string& endpoint, const std::string& text, double at) {
  return Scrape{endpoint, ParseExposition(text), at};
}

TEST(HistogramQuantileTest, InterpolatesInsideTheBucketTheRankFallsIn) {
  // 100 observations: 50 under 0.1, 40 in (0.1, 0.5], 10 in (0.5, 1].
  std::vector<std::pair<double, double>> b = {{0.1, 50}, {0.5, 90}, {1, 100}, {INFINITY, 100}};
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.5, b), 0.1);
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.7, b), 0.1 + 0.4 * (20.0 / 40.0));
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.99, b), 0.5 + 0.5 * (9.0 / 10.0));
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.25, b), 0.1 * (25.0 / 50.0)) << "first bucket from 0";
}

TEST(HistogramQuantileTest, RankInTheInfBucketGivesTheHighestFiniteBound) {
  std::vector<std::pair<double, double>> b = {{INFINITY, 10}, {0.1, 2}, {1, 5}};  // any order
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.99, b), 1);
}

TEST(HistogramQuantileTest, NoneWithoutInfBucketOrObservations) {
  EXPECT_FALSE(HistogramQuantile(0.99, {{0.1, 1}, {1, 2}}).has_value());
  EXPECT_FALSE(HistogramQuantile(0.99, {{0.1, 0}, {INFINITY, 0}}).has_value());
  EXPECT_FALSE(HistogramQuantile(0.99, {}).has_value());
}

TEST(HistogramQuantileTest, NonMonotonicCountsAreEvenedOut) {
  // A reset between scrapes can leave a lower bucket above a higher one.
  std::vector<std::pair<double, double>> b = {{0.1, 8}, {1, 4}, {INFINITY, 10}};
  EXPECT_DOUBLE_EQ(*HistogramQuantile(0.5, b), 0.1 * (5.0 / 8.0));
}

TEST(ViewModelTest, RatesComeFromTheDeltasOverTheInterval) {
  Scrape before = ScrapeOf("h:1", SidecarText(10, 1, 1e9, 0, {5, 9, 11, 11}), 100.0);
  Scrape after = ScrapeOf("h:1", SidecarText(30, 3, 3e9, 5e8, {5, 20, 32, 32}), 102.0);
  EndpointView v = ViewEndpoint(&before, after);
  ASSERT_TRUE(v.up);
  EXPECT_EQ(v.kind, EndpointKind::kSidecar);
  EXPECT_EQ(v.role, "prefill");
  EXPECT_EQ(v.rank, "1");
  EXPECT_EQ(v.session, "10.0.0.1:7000");
  ASSERT_TRUE(v.has_rates);
  EXPECT_DOUBLE_EQ(v.rooms_per_second, 22.0 / 2);
  EXPECT_DOUBLE_EQ(v.failures, 3);
  EXPECT_DOUBLE_EQ(v.failures_per_second, 1.0);
  EXPECT_DOUBLE_EQ(v.bytes_per_second, (2e9 + 5e8) / 2);
  ASSERT_EQ(v.peers.size(), 2u);  // lanes summed, fastest first
  EXPECT_EQ(v.peers[0].peer, "a:1");
  EXPECT_DOUBLE_EQ(v.peers[0].bytes_per_second, 1e9);
  EXPECT_EQ(v.peers[1].peer, "b:2");
  EXPECT_DOUBLE_EQ(v.peers[1].bytes_per_second, 2.5e8);
  // Deltas: 0 under 0.01, 11 under 0.1, 21 under 1 and in all: rank 20.79 is in (0.1, 1].
  ASSERT_TRUE(v.p99_seconds.has_value());
  EXPECT_DOUBLE_EQ(*v.p99_seconds, 0.1 + 0.9 * ((20.79 - 11) / 10));
  EXPECT_DOUBLE_EQ(v.bytes_in_flight, 4096);
}

TEST(ViewModelTest, NoRoomEndedMeansNoP99) {
  Scrape before = ScrapeOf("h:1", SidecarText(10, 0, 1e9, 0, {5, 9, 10, 10}), 1.0);
  Scrape after = ScrapeOf("h:1", SidecarText(10, 0, 1e9, 0, {5, 9, 10, 10}), 2.0);
  EndpointView v = ViewEndpoint(&before, after);
  EXPECT_TRUE(v.has_rates);
  EXPECT_EQ(v.rooms_per_second, 0);
  EXPECT_FALSE(v.p99_seconds.has_value());
}

TEST(ViewModelTest, ACounterThatWentDownCountsFromZero) {
  Scrape before = ScrapeOf("h:1", SidecarText(100, 0, 1e9, 0, {0, 0, 100, 100}), 1.0);
  Scrape after = ScrapeOf("h:1", SidecarText(4, 0, 1e6, 0, {0, 4, 4, 4}), 2.0);  // restarted
  EndpointView v = ViewEndpoint(&before, after);
  EXPECT_DOUBLE_EQ(v.rooms_per_second, 4);
  EXPECT_DOUBLE_EQ(v.bytes_per_second, 1e6);
  EXPECT_DOUBLE_EQ(*v.p99_seconds, 0.01 + 0.09 * (3.96 / 4));
}

TEST(ViewModelTest, WithoutAnEarlierScrapeThereAreNoRates) {
  Scrape after = ScrapeOf("h:1", SidecarText(10, 0, 1e9, 0, {5, 9, 10, 10}), 2.0);
  EndpointView v = ViewEndpoint(nullptr, after);
  EXPECT_TRUE(v.up);
  EXPECT_FALSE(v.has_rates);
  EXPECT_EQ(v.rooms_per_second, 0);
  Scrape down{"h:1", absl::UnavailableError("connection refused"), 1.0};
  EXPECT_FALSE(ViewEndpoint(&down, after).has_rates);
}

TEST(ViewModelTest, TheLastFailureIsTheNewest) {
  std::string text =
      "kvrail_last_failure_info{cause=\"timeout\",room=\"7\",reason=\"no status in 30 s\"} "
      "1700000000\n"
      "kvrail_last_failure_info{cause=\"fenced\",room=\"9\",reason=\"fenced\"} 1700000005\n";
  EndpointView v = ViewEndpoint(nullptr, ScrapeOf("h:1", text, 1.0));
  ASSERT_TRUE(v.last_failure.has_value());
  EXPECT_EQ(v.last_failure->cause, "fenced");
  EXPECT_EQ(v.last_failure->room, "9");
  EXPECT_EQ(v.last_failure->unix_seconds, 1700000005);
  EXPECT_EQ(v.kind, EndpointKind::kOther);
}

TEST(ViewModelTest, ABootstrapServerShowsRequestsAndRanks) {
  auto text = [](int requests) {
    return "kvrail_bootstrap_info{version=\"0.1\"} 1\n"
           "kvrail_bootstrap_requests_total{method=\"GET\",path=\"/route\",code=\"200\"} " +
           std::to_string(requests) +
           "\nkvrail_bootstrap_requests_total{method=\"PUT\",path=\"/route\",code=\"200\"} 2\n"
           "kvrail_bootstrap_registered_ranks 2\n";
  };
  EndpointView v = ViewEndpoint(nullptr, ScrapeOf("h:2", text(10), 0.0));
  Scrape before = ScrapeOf("h:2", text(10), 0.0);
  v = ViewEndpoint(&before, ScrapeOf("h:2", text(14), 0.5));
  EXPECT_EQ(v.kind, EndpointKind::kBootstrap);
  EXPECT_EQ(v.role, "bootstrap");
  EXPECT_DOUBLE_EQ(v.requests_per_second, 8);
  EXPECT_DOUBLE_EQ(v.registered_ranks, 2);
}

TEST(ViewModelTest, TheModelPairsScrapesByEndpointAndTotalsTheUpOnes) {
  std::vector<Scrape> before = {
      ScrapeOf("b:1", SidecarText(0, 0, 0, 0, {0, 0, 0, 0}), 10.0),
      ScrapeOf("a:1", SidecarText(0, 0, 0, 0, {0, 0, 0, 0}), 10.0),
  };
  std::vector<Scrape> after;
  after.push_back(ScrapeOf("a:1", SidecarText(10, 1, 1e9, 0, {0, 11, 11, 11}), 11.0));
  after.push_back(ScrapeOf("b:1", SidecarText(4, 0, 0, 1e9, {4, 4, 4, 4}), 11.0));
  after.push_back(Scrape{"c:1", absl::UnavailableError("connection refused"), 11.0});
  TopModel m = BuildModel(before, after);
  ASSERT_EQ(m.rows.size(), 3u);
  EXPECT_EQ(m.rows[0].endpoint, "a:1");
  EXPECT_DOUBLE_EQ(m.rows[0].rooms_per_second, 11);
  EXPECT_DOUBLE_EQ(m.rows[1].rooms_per_second, 4);
  EXPECT_FALSE(m.rows[2].up);
  EXPECT_EQ(m.rows[2].error, "connection refused");
  EXPECT_EQ(m.totals.up, 2);
  EXPECT_EQ(m.totals.down, 1);
  EXPECT_DOUBLE_EQ(m.totals.rooms_per_second, 15);
  EXPECT_DOUBLE_EQ(m.totals.bytes_per_second, 2e9);
  EXPECT_DOUBLE_EQ(m.totals.failures, 1);
  EXPECT_DOUBLE_EQ(m.totals.bytes_in_flight, 2 * 4096);
}

}  // namespace
}  // namespace kvrail::top
