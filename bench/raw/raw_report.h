// The rows of `kvrail bench raw` and the two ways they are printed: a table for people and
// `{"rows": [...]}` JSON for scripts.
#ifndef KVRAIL_BENCH_RAW_RAW_REPORT_H_
#define KVRAIL_BENCH_RAW_RAW_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::bench {

// One (link, block size, batch size) measurement. Rates are decimal: GB/s is 1e9 bytes
// per second.
struct RawRow {
  std::string link;  // "tcp", "shm", "netns", "verbs"
  // verbs rows: the verbs provider that carried the writes ("libibverbs", "softverbs"); empty
  // on UCX rows.
  std::string provider;
  // False where kvrail's figures are not a bandwidth (the software verbs provider: shared memory
  // on this host, never hardware): the table prints "n/a" for kvrail's rates, the JSON null, and
  // the row has no ratio. The row was still run, and its bytes verified at the target.
  bool bandwidth_claim = true;
  uint64_t block_bytes = 0;
  int batch = 0;
  double gbps = 0;       // kvrail: bytes landed (flushed) per second
  double ops_per_s = 0;  // kvrail: blocks landed per second
  // ucx_perftest -t ucp_put_bw at the same block size; nullopt when it gave no figure (note says
  // why).
  std::optional<double> peer_gbps;
  int peer_outstanding = 0;  // the -O it ran with
  // tcp and netns: ucx_perftest again with the UCX settings kvrail gives itself beyond TLS and
  // devices (transport::UcxTuningEnvironment: the tcp segment sizes), the comparison with the
  // same knobs turned.
  std::optional<double> peer_tuned_gbps;
  // The whole machine's CPUs during kvrail's window and during ucx_perftest's run (cpu_usage.h):
  // the share busy and the share in the kernel (system, irq, softirq), in [0, 1].
  std::optional<double> cpu_busy;
  std::optional<double> cpu_kernel;
  std::optional<double> peer_cpu_busy;
  std::optional<double> peer_cpu_kernel;
  // The copy limit: memcpy with `memcpy_threads` threads (kvrail's lanes) through the row's
  // working set in the pieces kvrail writes, a block or its slices (memcpy_limit.h).
  std::optional<double> memcpy_gbps;
  int memcpy_threads = 0;
  // kvrail with one lane (one thread each side, as ucx_perftest), its scheduler bound to the
  // bytes in flight ucx_perftest keeps (-O x block posted and not yet complete): the
  // like-for-like figure.
  std::optional<double> one_lane_gbps;
  // shm rows whose working set is more than one block: kvrail again, every write of every batch
  // into the same block, as ucx_perftest writes (its one buffer stays in cache). The same
  // comparison with kvrail's distinct pages taken out.
  std::optional<double> one_block_gbps;
  int lanes = 0;
  uint64_t inflight_bytes_per_lane = 0;
  uint64_t working_set = 0;
  std::string note;  // empty, or why a figure is missing or partial

  // The row's name in the table: "verbs(softverbs)", "verbs(libibverbs)"; the link on UCX rows.
  std::string label() const;

  // kvrail / ucx_perftest, when both are there.
  std::optional<double> ratio() const;
  // kvrail / ucx_perftest with kvrail's settings, when both are there.
  std::optional<double> tuned_ratio() const;
  // kvrail rewriting one block / ucx_perftest, when both are there.
  std::optional<double> one_block_ratio() const;
  // Like for like: kvrail with one lane / ucx_perftest with kvrail's UCX settings (tcp, netns:
  // peer_tuned_gbps; shm, where those settings change nothing UCX uses: peer_gbps), same
  // threads, same segment sizes, same bytes in flight.
  std::optional<double> like_ratio() const;
};

// The notes of verbs rows (no ucx_perftest baseline runs for them; perftest's ib_write_bw is not
// run either).
inline constexpr char kSoftverbsNote[] =
    "software verbs provider: a functional run through the verbs backend, not a bandwidth figure";
inline constexpr char kVerbsNoBaselineNote[] =
    "verbs: no baseline ran (ucx_perftest measures UCX, and perftest's ib_write_bw is not run)";

// Makes `row` a verbs row of `provider`: its provider, its note, and for "softverbs" no
// bandwidth claim.
void MarkVerbsRow(RawRow& row, const std::string& provider);

// {"rows": [{"link", "provider", "bandwidth_claim", "block_bytes", "batch", "gbps",
// "ops_per_s", "peer_gbps", "ratio", ...}]}; a missing figure is null, and so are kvrail's rates
// on a row without a bandwidth claim. One line, no trailing newline.
std::string RowsToJson(const std::vector<RawRow>& rows);
// Reads what RowsToJson wrote (the netns measurement runs in a child process). InvalidArgument
// when the text is not that shape.
absl::StatusOr<std::vector<RawRow>> RowsFromJson(absl::string_view json);

// The table: one line per row, then the notes and the units.
std::string RowsToTable(const std::vector<RawRow>& rows);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_RAW_RAW_REPORT_H_
