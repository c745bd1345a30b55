#include "bench/raw/raw_report.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bench/raw/raw_flags.h"

namespace kvrail::bench {
namespace {

nlohmann::json Optional(const std::optional<double>& value) {
  return value.has_value() ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

std::optional<double> ReadOptional(const nlohmann::json& row, const char* key) {
  if (!row.contains(key) || row.at(key).is_null()) return std::nullopt;
  return row.at(key).get<double>();
}

std::string Rate(double per_s) {
  if (per_s >= 1e6) return absl::StrFormat("%.2fM", per_s / 1e6);
  if (per_s >= 1e3) return absl::StrFormat("%.1fk", per_s / 1e3);
  return absl::StrFormat("%.1f", per_s);
}

}  // namespace

std::string RawRow::label() const {
  return provider.empty() ? link : absl::StrCat(link, "(", provider, ")");
}

void MarkVerbsRow(RawRow& row, const std::string& provider) {
  row.link = RawLinkName(RawLink::kVerbs);
  row.provider = provider;
  row.bandwidth_claim = provider != "softverbs";
  row.note = row.bandwidth_claim ? kVerbsNoBaselineNote : kSoftverbsNote;
}

std::optional<double> RawRow::ratio() const {
  if (!bandwidth_claim) return std::nullopt;
  if (!peer_gbps.has_value() || !(*peer_gbps > 0)) return std::nullopt;
  return gbps / *peer_gbps;
}

std::optional<double> RawRow::tuned_ratio() const {
  if (!bandwidth_claim) return std::nullopt;
  if (!peer_tuned_gbps.has_value() || !(*peer_tuned_gbps > 0)) return std::nullopt;
  return gbps / *peer_tuned_gbps;
}

std::optional<double> RawRow::one_block_ratio() const {
  if (!bandwidth_claim) return std::nullopt;
  if (!one_block_gbps.has_value() || !peer_gbps.has_value() || !(*peer_gbps > 0)) {
    return std::nullopt;
  }
  return *one_block_gbps / *peer_gbps;
}

std::optional<double> RawRow::like_ratio() const {
  if (!bandwidth_claim) return std::nullopt;
  const std::optional<double>& peer = link == "shm" ? peer_gbps : peer_tuned_gbps;
  if (!one_lane_gbps.has_value() || !peer.has_value() || !(*peer > 0)) return std::nullopt;
  return *one_lane_gbps / *peer;
}

std::string RowsToJson(const std::vector<RawRow>& rows) {
  nlohmann::json out = {{"rows", nlohmann::json::array()}};
  for (const RawRow& row : rows) {
    // kvrail's own rates, withheld where they are not a bandwidth.
    auto claim = [&row](const std::optional<double>& value) {
      return row.bandwidth_claim ? Optional(value) : nlohmann::json(nullptr);
    };
    out["rows"].push_back({
        {"link", row.link},
        {"provider", row.provider.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.provider)},
        {"bandwidth_claim", row.bandwidth_claim},
        {"block_bytes", row.block_bytes},
        {"batch", row.batch},
        {"gbps", claim(row.gbps)},
        {"ops_per_s", claim(row.ops_per_s)},
        {"peer_gbps", Optional(row.peer_gbps)},
        {"ratio", Optional(row.ratio())},
        {"memcpy_gbps", Optional(row.memcpy_gbps)},
        {"memcpy_threads", row.memcpy_threads},
        {"one_lane_gbps", claim(row.one_lane_gbps)},
        {"like_ratio", Optional(row.like_ratio())},
        {"peer_outstanding", row.peer_outstanding},
        {"peer_tuned_gbps", Optional(row.peer_tuned_gbps)},
        {"tuned_ratio", Optional(row.tuned_ratio())},
        {"one_block_gbps", claim(row.one_block_gbps)},
        {"one_block_ratio", Optional(row.one_block_ratio())},
        {"cpu_busy", Optional(row.cpu_busy)},
        {"cpu_kernel", Optional(row.cpu_kernel)},
        {"peer_cpu_busy", Optional(row.peer_cpu_busy)},
        {"peer_cpu_kernel", Optional(row.peer_cpu_kernel)},
        {"lanes", row.lanes},
        {"inflight_bytes_per_lane", row.inflight_bytes_per_lane},
        {"working_set_bytes", row.working_set},
        {"note", row.note},
    });
  }
  return out.dump();
}

absl::StatusOr<std::vector<RawRow>> RowsFromJson(absl::string_view json) {
  nlohmann::json in = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
  if (in.is_discarded() || !in.is_object() || !in.contains("rows") || !in["rows"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench rows: not {\"rows\": [...]} JSON: ", json.substr(0, 200)));
  }
  std::vector<RawRow> rows;
  try {
    for (const nlohmann::json& r : in["rows"]) {
      RawRow row;
      row.link = r.at("link").get<std::string>();
      if (r.contains("provider") && !r.at("provider").is_null()) {
        row.provider = r.at("provider").get<std::string>();
      }
      row.bandwidth_claim = r.value("bandwidth_claim", true);
      row.block_bytes = r.at("block_bytes").get<uint64_t>();
      row.batch = r.at("batch").get<int>();
      // Null only on a row without a bandwidth claim.
      if (row.bandwidth_claim || !r.at("gbps").is_null()) row.gbps = r.at("gbps").get<double>();
      if (row.bandwidth_claim || !r.at("ops_per_s").is_null()) {
        row.ops_per_s = r.at("ops_per_s").get<double>();
      }
      row.peer_gbps = ReadOptional(r, "peer_gbps");
      row.memcpy_gbps = ReadOptional(r, "memcpy_gbps");
      row.memcpy_threads = r.value("memcpy_threads", 0);
      row.one_lane_gbps = ReadOptional(r, "one_lane_gbps");
      row.peer_outstanding = r.value("peer_outstanding", 0);
      row.peer_tuned_gbps = ReadOptional(r, "peer_tuned_gbps");
      row.one_block_gbps = ReadOptional(r, "one_block_gbps");
      row.cpu_busy = ReadOptional(r, "cpu_busy");
      row.cpu_kernel = ReadOptional(r, "cpu_kernel");
      row.peer_cpu_busy = ReadOptional(r, "peer_cpu_busy");
      row.peer_cpu_kernel = ReadOptional(r, "peer_cpu_kernel");
      row.lanes = r.value("lanes", 0);
      row.inflight_bytes_per_lane = r.value("inflight_bytes_per_lane", uint64_t{0});
      row.working_set = r.value("working_set_bytes", uint64_t{0});
      row.note = r.value("note", std::string());
      rows.push_back(std::move(row));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bench rows: ", e.what()));
  }
  return rows;
}

std::string RowsToTable(const std::vector<RawRow>& rows) {
  auto figure = [](const std::optional<double>& value, int decimals) {
    return value.has_value() ? absl::StrFormat("%.*f", decimals, *value) : std::string("-");
  };
  auto cpu = [](const std::optional<double>& busy, const std::optional<double>& kernel) {
    if (!busy.has_value() || !kernel.has_value()) return std::string("-");
    return absl::StrFormat("%.0f/%.0f", 100 * *busy, 100 * *kernel);
  };
  // The link column is as wide as its longest name ("verbs(softverbs)"), at least 5 ("netns").
  int width = 5;
  bool verbs = false, withheld = false;
  for (const RawRow& row : rows) {
    width = std::max(width, static_cast<int>(row.label().size()));
    verbs = verbs || !row.provider.empty();
    withheld = withheld || !row.bandwidth_claim;
  }
  // kvrail's own rates: "n/a" on a row without a bandwidth claim.
  auto claimed = [](const RawRow& row, const std::optional<double>& value, int decimals) {
    if (!row.bandwidth_claim) return std::string("n/a");
    return value.has_value() ? absl::StrFormat("%.*f", decimals, *value) : std::string("-");
  };
  std::string out = absl::StrFormat(
      "%-*s %8s %6s %12s %10s %14s %4s %7s %10s %7s %10s %7s %10s %7s %12s %9s %9s\n", width,
      "link", "block", "batch", "kvrail GB/s", "ops/s", "perftest GB/s", "-O", "ratio",
      "tuned GB/s", "tuned", "1lane GB/s", "like", "1blk GB/s", "1blk", "memcpy GB/s", "cpu kv",
      "cpu pt");
  std::vector<std::string> notes;
  for (const RawRow& row : rows) {
    std::string mark;
    if (!row.note.empty()) {
      auto it = std::find(notes.begin(), notes.end(), row.note);
      if (it == notes.end()) it = notes.insert(notes.end(), row.note);
      mark = absl::StrCat(" [", it - notes.begin() + 1, "]");
    }
    absl::StrAppendFormat(
        &out, "%-*s %8s %6d %12s %10s %14s %4s %7s %10s %7s %10s %7s %10s %7s %12s %9s %9s%s\n",
        width, row.label(), FormatBytes(row.block_bytes), row.batch, claimed(row, row.gbps, 3),
        row.bandwidth_claim ? Rate(row.ops_per_s) : std::string("n/a"), figure(row.peer_gbps, 3),
        row.peer_outstanding > 0 ? absl::StrCat(row.peer_outstanding) : std::string("-"),
        figure(row.ratio(), 2), figure(row.peer_tuned_gbps, 3), figure(row.tuned_ratio(), 2),
        claimed(row, row.one_lane_gbps, 3), figure(row.like_ratio(), 2),
        claimed(row, row.one_block_gbps, 3), figure(row.one_block_ratio(), 2),
        figure(row.memcpy_gbps, 2), cpu(row.cpu_busy, row.cpu_kernel),
        cpu(row.peer_cpu_busy, row.peer_cpu_kernel), mark);
  }
  for (size_t i = 0; i < notes.size(); ++i) {
    absl::StrAppendFormat(&out, "[%d] %s\n", i + 1, notes[i]);
  }
  out +=
      "GB/s are decimal (1e9 B/s); ucx_perftest prints MB/s of 2^20 B/s, converted here. kvrail "
      "counts bytes landed: each batch is a room of the transfer scheduler, counted once its "
      "outcome is OK (flushed). ratio = kvrail / "
      "ucx_perftest ucp_put_bw at UCX's defaults (-O: its outstanding puts). tuned (tcp, netns): "
      "ucx_perftest given the UCX settings kvrail gives itself (UCX_TCP_TX_SEG_SIZE, "
      "UCX_TCP_RX_SEG_SIZE), and kvrail / that. 1lane: kvrail with one lane, its scheduler "
      "bound to ucx_perftest's bytes in flight (-O x block); like = 1lane / tuned ucx_perftest "
      "(shm: / ucx_perftest), "
      "the like-for-like ratio. 1blk (shm, batch > 1): 1lane again, writing every write "
      "into one block, as ucx_perftest does, and kvrail / ucx_perftest then. memcpy: as many "
      "threads as kvrail's lanes, the same working set, in kvrail's pieces (a block or its "
      "slices). cpu kv / cpu pt: the whole machine's CPU busy / in the kernel (system, irq, "
      "softirq), "
      "in percent, during kvrail's window and ucx_perftest's run.\n";
  if (verbs) {
    out +=
        "verbs(<provider>): kvrail's raw verbs backend (RC RDMA writes) through the same "
        "scheduler and target checks, provider from KVRAIL_VERBS_PROVIDER; no ucx_perftest "
        "baseline runs for it.";
    if (withheld) {
      out +=
          " n/a: softverbs is a software provider (shared memory on this host, never hardware): "
          "its rows show the verbs code path works, and kvrail's rates on them are no bandwidth "
          "figure.";
    }
    out += "\n";
  }
  return out;
}

}  // namespace kvrail::bench
