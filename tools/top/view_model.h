// What `kvrail top` shows, computed from two scrapes of each endpoint (pure).
//
// Rates are the deltas of counters between the previous and the current scrape over the time
// between them; a counter that went down (its process restarted) counts from zero, as
// Prometheus' rate() does, and a series the previous scrape lacked counts from zero too. The
// p99 room latency is histogram_quantile(0.99) over the deltas of the
// kvrail_room_duration_seconds buckets: only the rooms that ended in the interval.
#ifndef KVRAIL_TOOLS_TOP_VIEW_MODEL_H_
#define KVRAIL_TOOLS_TOP_VIEW_MODEL_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/top/exposition.h"

namespace kvrail::top {

// One endpoint's scrape: the parsed exposition, or why there is none (no answer, a bad status,
// a malformed line), taken at `at_seconds` on any clock the caller keeps steady.
struct Scrape {
  std::string endpoint;  // as the operator named it: host:port
  absl::StatusOr<Exposition> exposition = absl::UnavailableError("not scraped");
  double at_seconds = 0;
};

struct PeerRate {
  std::string peer;  // the peer label of kvrail_bytes_total
  double bytes_per_second = 0;
};

struct LastFailure {
  std::string cause;
  std::string room;
  std::string reason;
  double unix_seconds = 0;  // when it failed
};

enum class EndpointKind { kSidecar, kBootstrap, kOther };

struct EndpointView {
  std::string endpoint;
  bool up = false;
  std::string error;  // why it is down
  EndpointKind kind = EndpointKind::kOther;
  std::string role;  // sidecar: prefill or decode; bootstrap: "bootstrap"
  std::string rank;  // sidecar: its tp_rank label
  std::string session;
  // false when there is no earlier scrape of this endpoint to take deltas from: the rates
  // below are then 0 and mean nothing.
  bool has_rates = false;
  double rooms_per_second = 0;  // rooms that ended, succeeded or failed
  double bytes_per_second = 0;
  std::vector<PeerRate> peers;        // fastest first, then by name
  std::optional<double> p99_seconds;  // none: no room ended in the interval
  double failures = 0;                // rooms failed since the process started
  double failures_per_second = 0;
  std::optional<LastFailure> last_failure;
  double bytes_in_flight = 0;
  // Bootstrap servers.
  double requests_per_second = 0;
  double registered_ranks = 0;
};

struct Totals {
  int up = 0;
  int down = 0;
  double rooms_per_second = 0;
  double bytes_per_second = 0;
  double failures = 0;
  double failures_per_second = 0;
  double bytes_in_flight = 0;
};

struct TopModel {
  std::vector<EndpointView> rows;  // in the order of the scrapes given
  Totals totals;
};

// The view of `current`, with rates against `previous` (nullptr or a failed scrape: no rates).
EndpointView ViewEndpoint(const Scrape* previous, const Scrape& current);

// One row per scrape in `current`; each endpoint's previous scrape is the one in `previous`
// with the same endpoint, if any.
TopModel BuildModel(const std::vector<Scrape>& previous, const std::vector<Scrape>& current);

// histogram_quantile as Prometheus computes it over one histogram's cumulative buckets
// (upper bound, count), in any order: linear interpolation inside the bucket the rank falls
// in, the first bucket starting at 0, and the highest finite bound when the rank falls in the
// +Inf bucket. None when there is no +Inf bucket or no observation.
std::optional<double> HistogramQuantile(double q, std::vector<std::pair<double, double>> buckets);

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_VIEW_MODEL_H_
