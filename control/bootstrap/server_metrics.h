// What `kvrail bootstrap --metrics-port` exposes at GET /metrics (names in README.md,
// "Metrics"): requests by method, path and status, their workers' time, refusals by status, and
// the ranks registered now. Hooks for BootstrapServerOptions; counting is atomics.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_SERVER_METRICS_H_
#define KVRAIL_CONTROL_BOOTSTRAP_SERVER_METRICS_H_

#include "control/bootstrap/registry.h"
#include "control/bootstrap/server.h"
#include "engine/metrics/registry.h"

namespace kvrail::bootstrap {

class BootstrapMetrics {
 public:
  BootstrapMetrics();
  BootstrapMetrics(const BootstrapMetrics&) = delete;
  BootstrapMetrics& operator=(const BootstrapMetrics&) = delete;

  // Sets the hooks of `options` to count here (after whatever they did already); this object
  // must outlive the server.
  void Hook(BootstrapServerOptions& options);
  // kvrail_bootstrap_registered_ranks reads `registry` at each scrape; it must outlive this.
  void Watch(const PrefillRegistry* registry);

  void OnRequest(const RequestEvent& event);
  void OnRefusal(int http_status);

  const metrics::Registry& registry() const { return registry_; }

 private:
  metrics::Registry registry_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Histogram& request_duration_;
  metrics::Family<metrics::Counter>& refusals_;
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_SERVER_METRICS_H_
