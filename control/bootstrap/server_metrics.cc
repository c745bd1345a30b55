#include "control/bootstrap/server_metrics.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/metrics/build_info.h"

namespace kvrail::bootstrap {

BootstrapMetrics::BootstrapMetrics()
    : requests_(registry_.AddCounter("kvrail_bootstrap_requests_total",
                                     "Requests answered, by method, path and status",
                                     {"method", "path", "code"})),
      request_duration_(registry_
                            .AddHistogram("kvrail_bootstrap_request_duration_seconds",
                                          "A worker's time on a whole request",
                                          metrics::LatencyBuckets())
                            .With()),
      refusals_(registry_.AddCounter("kvrail_bootstrap_refusals_total",
                                     "Requests refused (intake bounds and registrations), by "
                                     "status",
                                     {"code"})) {
  registry_.AddGauge("kvrail_bootstrap_info", "This bootstrap server's version", {"version"})
      .With({metrics::kKvrailVersion})
      .Set(1);
}

void BootstrapMetrics::Hook(BootstrapServerOptions& options) {
  options.on_request = [this, before = std::move(options.on_request)](const RequestEvent& event) {
    if (before) before(event);
    OnRequest(event);
  };
  options.on_refusal = [this, before = std::move(options.on_refusal)](const RefusalEvent& event) {
    if (before) before(event);
    OnRefusal(event.http_status);
  };
  options.on_registration =
      [this, before = std::move(options.on_registration)](const RegistrationEvent& event) {
        if (before) before(event);
        if (!event.status.ok()) OnRefusal(event.http_status);
      };
}

void BootstrapMetrics::Watch(const PrefillRegistry* registry) {
  registry_.AddCollector([registry](std::vector<metrics::MetricFamily>& out) {
    size_t ranks = 0;
    for (const auto& [group, endpoints] : registry->Table()) ranks += endpoints.size();
    out.push_back({"kvrail_bootstrap_registered_ranks",
                   "Prefill ranks registered now",
                   metrics::MetricType::kGauge,
                   {{"", {}, static_cast<double>(ranks)}}});
  });
}

void BootstrapMetrics::OnRequest(const RequestEvent& event) {
  const std::string method =
      event.method == "GET" || event.method == "PUT" ? event.method : "other";
  const std::string path = event.path == "/route" || event.path == "/health" ? event.path : "other";
  requests_.With({method, path, absl::StrCat(event.http_status)}).Add();
  request_duration_.Observe(std::chrono::duration<double>(event.duration).count());
}

void BootstrapMetrics::OnRefusal(int http_status) {
  refusals_.With({absl::StrCat(http_status)}).Add();
}

}  // namespace kvrail::bootstrap
