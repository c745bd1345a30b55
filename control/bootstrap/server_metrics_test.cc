#include "control/bootstrap/server_metrics.h"

#include <httplib.h>

#include <string>

#include "control/bootstrap/server.h"
#include "gtest/gtest.h"

namespace kvrail::bootstrap {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(BootstrapMetricsTest, RequestsAreCountedByMethodPathAndStatus) {
  BootstrapMetrics metrics;
  BootstrapServerOptions options;
  metrics.Hook(options);
  BootstrapServer server(std::move(options));
  metrics.Watch(&server.registry());
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", server.port());
  ASSERT_TRUE(client.Get("/health"));
  ASSERT_TRUE(client.Get("/health"));
  ASSERT_TRUE(client.Get("/nowhere"));
  ASSERT_TRUE(client.Put("/route", "{not json", "application/json"));
  server.Stop();
  const std::string text = metrics.registry().Expose();
  EXPECT_TRUE(
      Has(text, R"(kvrail_bootstrap_requests_total{method="GET",path="/health",code="200"} 2)"))
      << text;
  EXPECT_TRUE(
      Has(text, R"(kvrail_bootstrap_requests_total{method="GET",path="other",code="404"} 1)"))
      << text;
  EXPECT_TRUE(Has(text, "kvrail_bootstrap_request_duration_seconds_count 4")) << text;
  EXPECT_TRUE(Has(text, "kvrail_bootstrap_registered_ranks 0")) << text;
  EXPECT_NE(text.find("kvrail_bootstrap_refusals_total{code=\""), std::string::npos) << text;
  EXPECT_NE(text.find("kvrail_bootstrap_info{version=\""), std::string::npos) << text;
}

}  // namespace
}  // namespace kvrail::bootstrap
