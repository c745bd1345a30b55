// The three ways `kvrail bench kv` prints its sweep: a summary table for people, and JSON and
// CSV for scripts (and bench/kv/plot_kv.py). Figures never measured (-1: no first byte seen)
// are null in JSON and empty in CSV.
#ifndef KVRAIL_BENCH_KV_KV_REPORT_H_
#define KVRAIL_BENCH_KV_KV_REPORT_H_

#include <string>

#include "bench/kv/kv_result.h"

namespace kvrail::bench {

// {"cases": [{"shape", "prefill_tp", "decode_tp", "tokens", "link", "mode", "bytes",
// "copies", "coalesced_copies", "gbps", "p50_ms", "p99_ms", "first_byte_ms",
// "first_byte_warm_ms", "efficiency", "rooms", "bytes_checked"}], "memcpy_gbps", "seconds",
// "notes": [...]}
std::string KvSweepToJson(const KvSweepResult& result);

// A header line, then one line per case in KvSweepToJson's key order (without the notes).
std::string KvSweepToCsv(const KvSweepResult& result);

// One line per case, then the notes and the memcpy line.
std::string KvSweepToTable(const KvSweepResult& result);

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_REPORT_H_
