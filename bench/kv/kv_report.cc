#include "bench/kv/kv_report.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvrail::bench {
namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json Measured(double value) {
  return value < 0 ? ordered_json(nullptr) : ordered_json(value);
}

ordered_json CaseJson(const KvCaseResult& c) {
  return {{"shape", c.shape},
          {"prefill_tp", c.prefill_tp},
          {"decode_tp", c.decode_tp},
          {"tokens", c.tokens},
          {"link", c.link},
          {"mode", c.mode},
          {"bytes", c.bytes},
          {"copies", c.copies},
          {"coalesced_copies", c.coalesced_copies},
          {"gbps", c.gbps},
          {"first_room_gbps", Measured(c.first_room_gbps)},
          {"p50_ms", c.p50_ms},
          {"p99_ms", c.p99_ms},
          {"first_byte_ms", Measured(c.first_byte_ms)},
          {"first_byte_warm_ms", Measured(c.first_byte_warm_ms)},
          {"efficiency", c.efficiency},
          {"naive_gain", Measured(c.naive_gain)},
          {"exposed_ms", Measured(c.exposed_ms)},
          {"layer_share_ms", Measured(c.layer_share_ms)},
          {"layer_compute_ms",
           Measured(c.layer_compute_scale >= 0 ? c.layer_share_ms * c.layer_compute_scale : -1)},
          {"exposed_ratio", Measured(c.exposed_ratio)},
          {"prefill_cpu_s_per_gib", Measured(c.prefill_cpu_s_per_gib)},
          {"decode_cpu_s_per_gib", Measured(c.decode_cpu_s_per_gib)},
          {"rooms", c.rooms},
          {"bytes_checked", c.bytes_checked}};
}

std::string Ms(double ms) { return ms < 0 ? "-" : absl::StrFormat("%.2f", ms); }

std::string Bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) return absl::StrFormat("%.2f GiB", b / 1073741824.0);
  if (bytes >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MiB", b / 1048576.0);
  return absl::StrFormat("%.1f KiB", b / 1024.0);
}

}  // namespace

std::string KvSweepToJson(const KvSweepResult& result) {
  ordered_json cases = ordered_json::array();
  for (const KvCaseResult& c : result.cases) cases.push_back(CaseJson(c));
  ordered_json doc = {{"cases", std::move(cases)},
                      {"memcpy_gbps", result.memcpy_gbps},
                      {"seconds", result.seconds},
                      {"notes", result.notes}};
  return doc.dump();
}

std::string KvSweepToCsv(const KvSweepResult& result) {
  std::vector<std::string> keys;
  const ordered_json header = CaseJson(KvCaseResult{});  // items() only views its json
  for (const auto& item : header.items()) keys.push_back(item.key());
  std::string out = absl::StrCat(absl::StrJoin(keys, ","), "\n");
  for (const KvCaseResult& c : result.cases) {
    std::vector<std::string> cells;
    const ordered_json row = CaseJson(c);
    for (const auto& item : row.items()) {
      // Our strings hold no comma or quote: presets, links and modes are fixed words.
      cells.push_back(item.value().is_null()     ? ""
                      : item.value().is_string() ? item.value().get<std::string>()
                                                 : item.value().dump());
    }
    absl::StrAppend(&out, absl::StrJoin(cells, ","), "\n");
  }
  return out;
}

std::string KvSweepToTable(const KvSweepResult& result) {
  std::string out = absl::StrFormat(
      "%-16s %5s %6s %-5s %-10s %10s %8s %9s %8s %8s %9s %9s %9s %9s %6s %7s %6s %6s\n", "shape",
      "tp", "tokens", "link", "mode", "bytes", "copies", "coalesced", "GB/s", "GB/s_1st", "p50_ms",
      "p99_ms", "1st_fresh", "1st_warm", "eff", "x_naive", "cpu_p", "cpu_d");
  for (const KvCaseResult& c : result.cases) {
    absl::StrAppendFormat(
        &out,
        "%-16s %5s %6d %-5s %-10s %10s %8d %9d %8.2f %8s %9.2f %9.2f %9s %9s %6.2f %7s %6s %6s\n",
        c.shape, absl::StrCat(c.prefill_tp, ":", c.decode_tp), c.tokens, c.link, c.mode,
        Bytes(c.bytes), c.copies, c.coalesced_copies, c.gbps,
        c.first_room_gbps < 0 ? "-" : absl::StrFormat("%.2f", c.first_room_gbps), c.p50_ms,
        c.p99_ms, Ms(c.first_byte_ms), Ms(c.first_byte_warm_ms), c.efficiency,
        c.naive_gain < 0 ? "-" : absl::StrFormat("%.2f", c.naive_gain),
        c.prefill_cpu_s_per_gib < 0 ? "-" : absl::StrFormat("%.2f", c.prefill_cpu_s_per_gib),
        c.decode_cpu_s_per_gib < 0 ? "-" : absl::StrFormat("%.2f", c.decode_cpu_s_per_gib));
  }
  absl::StrAppendFormat(&out,
                        "GB/s: bytes / the data plane's seconds, warm rooms; GB/s_1st: the first "
                        "room's (fresh connection, pages no room wrote); eff: GB/s / the "
                        "contiguous room's of the same bytes and link; x_naive: GB/s / the "
                        "naive row's (--naive: one write per row, never merged); cpu_p, cpu_d: "
                        "CPU seconds of the prefill and of the decode sidecars per GiB, warm "
                        "rooms; single-thread memcpy here: %.2f GB/s; sweep %.1f s\n",
                        result.memcpy_gbps, result.seconds);
  for (const KvCaseResult& c : result.cases) {
    if (c.mode != "layerwise") continue;
    // The target is judged where the compute per layer is one share (--layer-compute-scale 1).
    const bool judged = c.layer_compute_scale == 1;
    const std::string verdict =
        judged ? (c.exposed_ratio >= 0 && c.exposed_ratio <= 1.5 ? "met" : "MISSED")
               : "not judged: the target's compute is one share";
    absl::StrAppendFormat(
        &out,
        "layerwise %s %d:%d %d tokens %s: %.2f ms exposed after the last layer, one layer's "
        "share %.2f ms, simulated compute per layer %.2f ms: %.2fx, target <= 1.5 %s\n",
        c.shape, c.prefill_tp, c.decode_tp, c.tokens, c.link, c.exposed_ms, c.layer_share_ms,
        c.layer_share_ms * c.layer_compute_scale, c.exposed_ratio, verdict);
  }
  for (const std::string& note : result.notes) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

}  // namespace kvrail::bench
