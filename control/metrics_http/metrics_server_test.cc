#include "control/metrics_http/metrics_server.h"

#include <httplib.h>

#include <memory>
#include <string>

#include "engine/metrics/registry.h"
#include "gtest/gtest.h"

namespace kvrail::metrics_http {
namespace {

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.AddCounter("kvrail_rooms_total", "Rooms", {"outcome", "cause"})
        .With({"succeeded", ""})
        .Add(3);
    absl::StatusOr<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start({}, [this] { return registry_.Expose(); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
  }

  metrics::Registry registry_;
  std::unique_ptr<MetricsServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(MetricsServerTest, GetMetricsAnswersTheExposition) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
  httplib::Result res = client_->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(res->body.find("kvrail_rooms_total{outcome=\"succeeded\",cause=\"\"} 3\n"),
            std::string::npos)
      << res->body;
}

TEST_F(MetricsServerTest, EachScrapeReadsTheValuesNow) {
  registry_.AddGauge("kvrail_bytes_in_flight", "Bytes").With().Set(7);
  httplib::Result res = client_->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("kvrail_bytes_in_flight 7\n"), std::string::npos) << res->body;
}

TEST_F(MetricsServerTest, OtherPathsAre404AndOtherMethods405) {
  httplib::Result other = client_->Get("/route");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  httplib::Result put = client_->Put("/metrics", "x", "text/plain");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 405);
}

TEST(MetricsServerStartTest, APortInUseIsUnavailableNamingTheAddress) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start({}, [] { return std::string(); });
  ASSERT_TRUE(first.ok());
  MetricsServerOptions options;
  options.port = (*first)->port();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(options, [] { return std::string(); });
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(options.port)),
            std::string::npos);
}

TEST(MetricsServerStartTest, APortOutOfRangeIsInvalid) {
  MetricsServerOptions options;
  options.port = 70000;
  EXPECT_EQ(MetricsServer::Start(options, [] { return std::string(); }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvrail::metrics_http
