// Views for the renderer's and the JSON frame's tests: a prefill sidecar with rates, two
// peers and a last failure, a bootstrap server, and an endpoint that is down.
#ifndef KVRAIL_TOOLS_TOP_TEST_VIEWS_H_
#define KVRAIL_TOOLS_TOP_TEST_VIEWS_H_

#include "tools/top/view_model.h"

namespace kvrail::top {

inline EndpointView PrefillView() {
  EndpointView v;
  v.endpoint = "127.0.0.1:9101";
  v.up = true;
  v.kind = EndpointKind::kSidecar;
  v.role = "prefill";
  v.rank = "0";
  v.session = "127.0.0.1:7000";
  v.has_rates = true;
  v.rooms_per_second = 11;
  v.bytes_per_second = 1.25e9;
  v.peers = {{"10.0.0.2:7000", 1e9}, {"10.0.0.3:7000", 2.5e8}};
  v.p99_seconds = 0.8701;
  v.failures = 1;
  v.failures_per_second = 0.5;
  v.last_failure = LastFailure{"timeout", "7", "no status in 30 s", 1.7e9};
  v.bytes_in_flight = 4096;
  return v;
}

// PrefillView, a bootstrap server and a down endpoint, with their totals.
inline TopModel ThreeEndpoints() {
  TopModel m;
  m.rows.push_back(PrefillView());
  EndpointView bootstrap;
  bootstrap.endpoint = "127.0.0.1:9100";
  bootstrap.up = true;
  bootstrap.kind = EndpointKind::kBootstrap;
  bootstrap.role = "bootstrap";
  bootstrap.has_rates = true;
  bootstrap.requests_per_second = 8;
  bootstrap.registered_ranks = 2;
  m.rows.push_back(bootstrap);
  EndpointView down;
  down.endpoint = "127.0.0.1:9103";
  down.error = "no answer: Connection";
  m.rows.push_back(down);
  m.totals = Totals{2, 1, 11, 1.25e9, 1, 0.5, 4096};
  return m;
}

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_TEST_VIEWS_H_
