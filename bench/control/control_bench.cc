#include "bench/control/control_bench.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cluster/process/subprocess.h"
#include "control/bootstrap/server.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/layout/manifest.h"
#include "control/sidecar/sidecar.h"
#include "engine/base/error.h"
#include "engine/memory/arena.h"

namespace kvrail::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPageTokens = 16;
// A room that makes no progress for this long fails the benchmark.
constexpr absl::Duration kStall = absl::Seconds(10);

// The contract both arenas share: one layer, one 256-byte page per K and V field. Empty
// payloads: the group keeps a sliding window of 1 token, so no block of a prompt that ends on a
// block boundary is copied (CACHEPD §5.2).
absl::StatusOr<layout::Contract> BenchContract(int pages_per_room) {
  layout::KvShape shape;
  shape.layers = 1;
  shape.kv_heads = 1;
  shape.head_dim = 8;
  shape.page_tokens = kPageTokens;
  shape.prefix_granularity = kPageTokens;
  shape.pages = std::max(4, pages_per_room);
  KVRAIL_ASSIGN_OR_RETURN(layout::Contract contract, layout::BuildKvContract(shape, 1));
  if (pages_per_room == 0) {
    const std::string group = "sliding_window";
    for (layout::GroupLayout& g : contract.plan.groups) g.group_id = group;
    for (layout::FieldLayout& f : contract.plan.fields) f.group_id = group;
    for (layout::GroupSpec& spec : contract.group_specs) {
      spec.group_id = group;
      spec.retention = layout::Retention::kSlidingWindow;
      spec.sliding_window_tokens = 1;
    }
  }
  KVRAIL_RETURN_IF_ERROR(layout::ValidateContract(contract));
  return contract;
}

// Blocks 1..pages (or one, unused, for empty payloads) for a prompt of `pages` pages.
absl::StatusOr<layout::Manifest> BenchManifest(const layout::Contract& contract,
                                               int pages_per_room) {
  const int pages = std::max(1, pages_per_room);
  std::vector<int64_t> blocks;
  for (int64_t i = 1; i <= pages; ++i) blocks.push_back(i);
  const std::vector<std::vector<int64_t>> table = {blocks};
  return layout::BuildManifest(contract, table, 0, int64_t{pages} * kPageTokens);
}

// CPU time this process has used, all threads, user and system.
double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// One engine: its arena and its engine API client.
struct Engine {
  std::optional<Arena> arena;
  std::unique_ptr<engine_api::EngineApiClient> client;
};

class Bench {
 public:
  explicit Bench(const ControlBenchOptions& options) : options_(options) {}

  ~Bench() {
    // Sidecars first: they map the arenas and talk to the bootstrap server.
    if (decode_sidecar_) decode_sidecar_->Stop();
    if (prefill_sidecar_) prefill_sidecar_->Stop();
    if (bootstrap_) bootstrap_->Stop();
  }

  absl::Status Start() {
    KVRAIL_ASSIGN_OR_RETURN(contract_, BenchContract(options_.pages_per_room));
    KVRAIL_ASSIGN_OR_RETURN(layout::Manifest manifest,
                            BenchManifest(contract_, options_.pages_per_room));
    KVRAIL_ASSIGN_OR_RETURN(manifest_wire_, layout::SerializeManifest(manifest));
    KVRAIL_ASSIGN_OR_RETURN(contract_wire_, layout::SerializeContract(contract_));
    for (const layout::ManifestGroup& group : manifest.groups) {
      blocks_per_room_ += group.block_ids.size();
    }
    bootstrap_ = std::make_unique<bootstrap::BootstrapServer>();
    KVRAIL_RETURN_IF_ERROR(AddContext(bootstrap_->Start("127.0.0.1", 0), "bootstrap server"));
    bootstrap_address_ = absl::StrCat("127.0.0.1:", bootstrap_->port());

    const std::string tag = absl::StrCat("kvrail-benchctl-", process::ProcessTag());
    auto endpoint = [&](const char* side) {
      return options_.engine_api == "tcp" ? std::string("tcp://127.0.0.1:0")
                                          : absl::StrCat("ipc:///tmp/", tag, "-", side, ".sock");
    };
    sidecar::SidecarOptions prefill;
    prefill.role = sidecar::Role::kPrefill;
    prefill.engine_endpoint = endpoint("p");
    prefill.bootstrap = bootstrap_address_;
    prefill.tls = options_.link == "shm" ? "sm" : options_.link;  // UCX's name for it
    KVRAIL_ASSIGN_OR_RETURN(prefill_sidecar_, sidecar::Sidecar::Start(prefill));
    sidecar::SidecarOptions decode = prefill;
    decode.role = sidecar::Role::kDecode;
    decode.engine_endpoint = endpoint("d");
    decode.bootstrap.clear();
    KVRAIL_ASSIGN_OR_RETURN(decode_sidecar_, sidecar::Sidecar::Start(decode));

    KVRAIL_RETURN_IF_ERROR(
        Attach(prefill_, "/" + tag + "-p", prefill_sidecar_->engine_endpoint(), "prefill"));
    KVRAIL_RETURN_IF_ERROR(
        Attach(decode_, "/" + tag + "-d", decode_sidecar_->engine_endpoint(), "decode"));
    return absl::OkStatus();
  }

  // Keeps `in_flight` rooms going for warmup + window seconds (or, with `rate` > 0, starts
  // rooms at that rate, at most `in_flight` at a time); measures the window.
  absl::StatusOr<ControlBenchRow> Row(int in_flight, double rate, double warmup_seconds,
                                      double window_seconds) {
    ControlBenchRow row;
    row.in_flight = in_flight;
    row.rate = rate;
    std::vector<double> latencies_ms;
    auto span = [](double seconds) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    };
    const Clock::time_point start = Clock::now();
    const Clock::time_point window_begin = start + span(warmup_seconds);
    const Clock::time_point window_end = window_begin + span(window_seconds);
    const Clock::duration period = rate > 0 ? span(1 / rate) : Clock::duration::zero();
    Clock::time_point next_due = start;
    // Starts what is due: closed loop, rooms up to in_flight; paced, the rooms whose time has
    // come, as far as in_flight allows (a start held back by it counts as capped).
    auto start_due = [&](Clock::time_point now) -> absl::Status {
      if (now >= window_end) return absl::OkStatus();
      if (rate <= 0) {
        while (static_cast<int>(started_.size()) < in_flight) KVRAIL_RETURN_IF_ERROR(StartRoom());
        return absl::OkStatus();
      }
      while (now >= next_due) {
        if (static_cast<int>(started_.size()) >= in_flight) {
          if (now >= window_begin) ++row.capped;
          next_due = now + period;  // the schedule slips; no burst to catch up
          break;
        }
        KVRAIL_RETURN_IF_ERROR(StartRoom());
        next_due += period;
      }
      return absl::OkStatus();
    };
    KVRAIL_RETURN_IF_ERROR(start_due(start));
    Clock::time_point last_progress = start;
    // Process CPU over the window: sampled when the window opens and when it closes.
    std::optional<double> cpu_begin;
    std::optional<double> cpu_end;
    if (warmup_seconds <= 0) cpu_begin = ProcessCpuSeconds();
    for (Clock::time_point now = start; now < window_end || !started_.empty();) {
      absl::Duration wait = absl::Milliseconds(100);
      if (rate > 0 && now < window_end) {
        wait = std::min(wait, absl::FromChrono(std::max(next_due - now, Clock::duration::zero())));
      }
      KVRAIL_ASSIGN_OR_RETURN(std::optional<v1::SidecarMessage> message,
                              decode_.client->NextMessage(wait));
      KVRAIL_RETURN_IF_ERROR(DrainPrefill());
      now = Clock::now();
      if (!cpu_begin && now >= window_begin) cpu_begin = ProcessCpuSeconds();
      if (!cpu_end && now > window_end) cpu_end = ProcessCpuSeconds();
      if (!message.has_value()) {
        if (started_.empty()) last_progress = now;
        if (now - last_progress > absl::ToChronoNanoseconds(kStall)) {
          return absl::DeadlineExceededError(
              absl::StrCat("control bench: at ", in_flight, " in flight, ", started_.size(),
                           " room(s) made no progress for ", absl::FormatDuration(kStall),
                           "; the oldest is room ", OldestRoom(), "; ", SidecarCounts()));
        }
        KVRAIL_RETURN_IF_ERROR(start_due(now));
        continue;
      }
      last_progress = now;
      if (message->has_reply()) {
        KVRAIL_RETURN_IF_ERROR(CheckReply(message->reply(), "decode"));
        KVRAIL_RETURN_IF_ERROR(start_due(now));
        continue;
      }
      const v1::RoomEvent& event = message->event();
      auto room = started_.find(event.room());
      if (room == started_.end()) {
        return absl::InternalError(
            absl::StrCat("control bench: decode event for room ", event.room(), " not in flight"));
      }
      if (event.status() != v1::TRANSFER_POLL_SUCCESS) {
        return absl::InternalError(absl::StrCat("control bench: decode room ", event.room(),
                                                " ended ", v1::TransferPoll_Name(event.status()),
                                                ": ", event.reason()));
      }
      if (now >= window_begin && now <= window_end) {
        latencies_ms.push_back(
            std::chrono::duration<double, std::milli>(now - room->second).count());
      }
      started_.erase(room);
      KVRAIL_RETURN_IF_ERROR(start_due(now));
    }
    // Every prefill room must have reported Success too.
    const absl::Time deadline = absl::Now() + kStall;
    while (prefill_done_ < next_room_ - 1) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("control bench: the prefill reported ",
                                                        prefill_done_, " of ", next_room_ - 1,
                                                        " rooms done"));
      }
      KVRAIL_ASSIGN_OR_RETURN(std::optional<v1::SidecarMessage> message,
                              prefill_.client->NextMessage(absl::Milliseconds(100)));
      if (message.has_value()) KVRAIL_RETURN_IF_ERROR(OnPrefillMessage(*message));
    }
    KVRAIL_RETURN_IF_ERROR(DrainPrefill());
    std::sort(latencies_ms.begin(), latencies_ms.end());
    row.rooms = latencies_ms.size();
    row.seconds = window_seconds;
    row.rooms_per_s = window_seconds > 0 ? static_cast<double>(row.rooms) / window_seconds : 0;
    row.p50_ms = Percentile(latencies_ms, 0.50);
    row.p99_ms = Percentile(latencies_ms, 0.99);
    row.max_ms = latencies_ms.empty() ? 0 : latencies_ms.back();
    if (cpu_begin && cpu_end && row.rooms > 0) {
      row.cpu_us_per_room = (*cpu_end - *cpu_begin) * 1e6 / static_cast<double>(row.rooms);
    }
    return row;
  }

  // The sidecars' own counts agree: every room succeeded on both, and no byte moved for empty
  // payloads.
  absl::Status CheckTotals() const {
    const uint64_t rooms = next_room_ - 1;
    const sidecar::SidecarStats p = prefill_sidecar_->stats();
    const sidecar::SidecarStats d = decode_sidecar_->stats();
    if (p.rooms_succeeded != rooms || d.rooms_succeeded != rooms || p.rooms_failed != 0 ||
        d.rooms_failed != 0) {
      return absl::InternalError(absl::StrFormat(
          "control bench: %d rooms run; prefill sidecar counts %d succeeded, %d failed; decode "
          "sidecar %d succeeded, %d failed",
          rooms, p.rooms_succeeded, p.rooms_failed, d.rooms_succeeded, d.rooms_failed));
    }
    if (p.peer_messages_rejected != 0 || d.peer_messages_rejected != 0) {
      return absl::InternalError(absl::StrFormat(
          "control bench: the sidecars refused CachePD messages (prefill %d, decode %d)",
          p.peer_messages_rejected, d.peer_messages_rejected));
    }
    const uint64_t expected_bytes = rooms * payload_bytes();
    if (p.bytes_sent != expected_bytes) {
      return absl::InternalError(
          absl::StrFormat("control bench: the prefill sent %d bytes for %d rooms, expected %d",
                          p.bytes_sent, rooms, expected_bytes));
    }
    return absl::OkStatus();
  }

  uint64_t rooms_total() const { return next_room_ - 1; }

  std::string SidecarCounts() const {
    const sidecar::SidecarStats p = prefill_sidecar_->stats();
    const sidecar::SidecarStats d = decode_sidecar_->stats();
    return absl::StrFormat(
        "rooms started %d; prefill sidecar: %d succeeded, %d failed; decode sidecar: %d "
        "succeeded, %d failed",
        next_room_ - 1, p.rooms_succeeded, p.rooms_failed, d.rooms_succeeded, d.rooms_failed);
  }

  uint64_t payload_bytes() const {
    uint64_t page_bytes = 0;
    for (const layout::FieldLayout& field : contract_.plan.fields) {
      page_bytes += static_cast<uint64_t>(layout::PayloadBytes(field));
    }
    return blocks_per_room_ * page_bytes;
  }

  std::string payload() const {
    if (options_.pages_per_room == 0) {
      return absl::StrCat("empty: 0 blocks, 0 bytes per room (a sliding window of 1 token, ",
                          "prompt of ", kPageTokens, " tokens, CACHEPD §5.2)");
    }
    return absl::StrCat(blocks_per_room_, " page(s), ", payload_bytes(), " bytes per room");
  }

 private:
  absl::Status Attach(Engine& engine, const std::string& arena_name, const std::string& endpoint,
                      const char* side) {
    (void)Arena::UnlinkShared(arena_name);  // a name left by a crashed run
    KVRAIL_ASSIGN_OR_RETURN(Arena arena, Arena::CreateShared(arena_name, contract_.ArenaBytes()));
    engine.arena = std::move(arena);
    KVRAIL_ASSIGN_OR_RETURN(engine.client, engine_api::EngineApiClient::Connect(endpoint));
    v1::EngineRequest attach;
    attach.mutable_attach()->set_shm_name(arena_name);
    attach.mutable_attach()->set_contract(contract_wire_);
    absl::StatusOr<v1::EngineReply> attached = engine.client->Call(attach, absl::Seconds(30));
    if (!attached.ok()) {
      return AddContext(attached.status(), absl::StrCat("control bench: attach the ", side));
    }
    return absl::OkStatus();
  }

  absl::Status StartRoom() {
    const uint64_t room = next_room_++;
    v1::EngineRequest expect;
    expect.mutable_expect()->set_room(room);
    expect.mutable_expect()->set_bootstrap_address(bootstrap_address_);
    expect.mutable_expect()->set_destination_manifest(manifest_wire_);
    v1::EngineRequest ready;
    ready.mutable_ready()->set_room(room);
    ready.mutable_ready()->set_source_manifest(manifest_wire_);
    ready.mutable_ready()->set_bootstrap_token(static_cast<int64_t>(room));
    started_.emplace(room, Clock::now());
    KVRAIL_RETURN_IF_ERROR(decode_.client->Send(std::move(expect)).status());
    KVRAIL_RETURN_IF_ERROR(prefill_.client->Send(std::move(ready)).status());
    return absl::OkStatus();
  }

  absl::Status CheckReply(const v1::EngineReply& reply, const char* side) const {
    if (reply.error().empty()) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("control bench: the ", side, " sidecar refused a request: ", reply.error()));
  }

  absl::Status OnPrefillMessage(const v1::SidecarMessage& message) {
    if (message.has_reply()) return CheckReply(message.reply(), "prefill");
    const v1::RoomEvent& event = message.event();
    if (event.status() != v1::TRANSFER_POLL_SUCCESS) {
      return absl::InternalError(absl::StrCat("control bench: prefill room ", event.room(),
                                              " ended ", v1::TransferPoll_Name(event.status()),
                                              ": ", event.reason()));
    }
    ++prefill_done_;
    return absl::OkStatus();
  }

  absl::Status DrainPrefill() {
    while (true) {
      KVRAIL_ASSIGN_OR_RETURN(std::optional<v1::SidecarMessage> message,
                              prefill_.client->NextMessage(absl::ZeroDuration()));
      if (!message.has_value()) return absl::OkStatus();
      KVRAIL_RETURN_IF_ERROR(OnPrefillMessage(*message));
    }
  }

  uint64_t OldestRoom() const {
    uint64_t oldest = next_room_;
    for (const auto& [room, at] : started_) oldest = std::min(oldest, room);
    return oldest;
  }

  const ControlBenchOptions& options_;
  layout::Contract contract_;
  std::string contract_wire_;
  std::string manifest_wire_;
  uint64_t blocks_per_room_ = 0;
  std::unique_ptr<bootstrap::BootstrapServer> bootstrap_;
  std::string bootstrap_address_;
  std::unique_ptr<sidecar::Sidecar> prefill_sidecar_;
  std::unique_ptr<sidecar::Sidecar> decode_sidecar_;
  Engine prefill_;
  Engine decode_;
  uint64_t next_room_ = 1;
  absl::flat_hash_map<uint64_t, Clock::time_point> started_;  // rooms in flight
  uint64_t prefill_done_ = 0;
};

// "100 in flight" (closed loop) or "paced 20000/s, <= 100 in flight".
std::string Mode(int in_flight, double rate) {
  if (rate <= 0) return absl::StrCat(in_flight, " in flight");
  return absl::StrFormat("paced %.0f/s, <= %d in flight", rate, in_flight);
}

// Sidecars log at info; the benchmark's output is the table. Warnings still show.
class QuietLogs {
 public:
  QuietLogs() : level_(spdlog::get_level()) {
    if (level_ < spdlog::level::warn) spdlog::set_level(spdlog::level::warn);
  }
  ~QuietLogs() { spdlog::set_level(level_); }

 private:
  spdlog::level::level_enum level_;
};

}  // namespace

absl::Status CheckControlBenchOptions(const ControlBenchOptions& options) {
  if (options.in_flight.empty()) {
    return absl::InvalidArgumentError("control bench: in_flight is empty; give at least one row");
  }
  for (int n : options.in_flight) {
    if (n < 1 || n > 100000) {
      return absl::InvalidArgumentError(
          absl::StrCat("control bench: in_flight ", n, " lies outside 1..100000"));
    }
  }
  if (!(options.seconds_per_row > 0) || options.seconds_per_row > 3600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control bench: seconds_per_row ", options.seconds_per_row, " lies outside (0, 3600]"));
  }
  if (!(options.warmup_seconds >= 0) || options.warmup_seconds > 3600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control bench: warmup_seconds ", options.warmup_seconds, " lies outside [0, 3600]"));
  }
  if (options.link == "sm") {
    return absl::InvalidArgumentError(
        "control bench: link \"sm\": write shm (UCX shared memory; sm is UCX's own name for it)");
  }
  if (options.link != "tcp" && options.link != "shm") {
    return absl::InvalidArgumentError(
        absl::StrCat("control bench: link \"", options.link, "\": expected tcp or shm"));
  }
  if (options.engine_api != "ipc" && options.engine_api != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("control bench: engine_api \"",
                                                   options.engine_api, "\": expected ipc or tcp"));
  }
  if (options.paced_target_row &&
      (options.target_in_flight < 1 || options.target_in_flight > 100000 ||
       !(options.target_rooms_per_s > 0) || options.target_rooms_per_s > 1e7)) {
    return absl::InvalidArgumentError(
        absl::StrCat("control bench: the paced row needs target_in_flight in 1..100000 (got ",
                     options.target_in_flight, ") and target_rooms_per_s in (0, 1e7] (got ",
                     options.target_rooms_per_s, ")"));
  }
  if (options.pages_per_room < 0 || options.pages_per_room > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control bench: pages_per_room ", options.pages_per_room, " lies outside 0..1024"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ControlBenchResult> MeasureControlBench(const ControlBenchOptions& options) {
  KVRAIL_RETURN_IF_ERROR(CheckControlBenchOptions(options));
  QuietLogs quiet;
  Bench bench(options);
  KVRAIL_RETURN_IF_ERROR(bench.Start());
  // The first room sets up what every later room reuses: the decode's registration, its
  // bootstrap lookups and the data-plane connection.
  KVRAIL_RETURN_IF_ERROR(bench.Row(1, 0, 0, 0).status());
  ControlBenchResult result;
  // The closed-loop rows, then (paced_target_row) rooms offered at the target rate.
  std::vector<std::pair<int, double>> plan;
  for (int in_flight : options.in_flight) plan.emplace_back(in_flight, 0.0);
  if (options.paced_target_row) {
    plan.emplace_back(options.target_in_flight, options.target_rooms_per_s);
  }
  for (const auto& [in_flight, rate] : plan) {
    if (options.progress) {
      std::fprintf(stderr, "control bench: %s, %.1f s + %.1f s warm-up ...\n",
                   Mode(in_flight, rate).c_str(), options.seconds_per_row, options.warmup_seconds);
    }
    KVRAIL_ASSIGN_OR_RETURN(ControlBenchRow row, bench.Row(in_flight, rate, options.warmup_seconds,
                                                           options.seconds_per_row));
    if (options.progress) {
      std::fprintf(stderr, "control bench: %s: %.0f rooms/s, p50 %.3f ms, p99 %.3f ms\n",
                   Mode(in_flight, rate).c_str(), row.rooms_per_s, row.p50_ms, row.p99_ms);
    }
    const bool p99_met = row.rooms > 0 && row.p99_ms <= options.target_p99_ms;
    if (in_flight == options.target_in_flight && rate == 0) {
      result.target_measured = true;
      result.target_rooms_met = row.rooms_per_s >= options.target_rooms_per_s;
      result.target_p99_met = p99_met;
    } else if (in_flight == options.target_in_flight && rate == options.target_rooms_per_s) {
      result.paced_measured = true;
      // The offered rate was carried (within 2%, no start held back) with the p99 in bounds.
      result.paced_rate_met =
          row.rooms_per_s >= 0.98 * options.target_rooms_per_s && row.capped == 0;
      result.paced_p99_met = p99_met;
    }
    result.rows.push_back(row);
  }
  KVRAIL_RETURN_IF_ERROR(bench.CheckTotals());
  result.payload = bench.payload();
  result.payload_bytes = bench.payload_bytes();
  result.rooms_total = bench.rooms_total();
  result.target_in_flight = options.target_in_flight;
  result.target_rooms_per_s = options.target_rooms_per_s;
  result.target_p99_ms = options.target_p99_ms;
  return result;
}

std::string FormatControlBenchTable(const ControlBenchResult& result) {
  std::string out =
      absl::StrCat("control path, P=1 D=1 in one process, payload ", result.payload, "\n",
                   absl::StrFormat("%-44s %9s %12s %9s %9s %9s %12s\n", "rooms", "measured",
                                   "rooms/s", "p50_ms", "p99_ms", "max_ms", "cpu_us/room"));
  for (const ControlBenchRow& row : result.rows) {
    std::string mode = Mode(row.in_flight, row.rate);
    if (row.capped > 0) absl::StrAppend(&mode, " (", row.capped, " capped)");
    absl::StrAppendFormat(&out, "%-44s %9d %12.0f %9.3f %9.3f %9.3f %12.1f\n", mode, row.rooms,
                          row.rooms_per_s, row.p50_ms, row.p99_ms, row.max_ms, row.cpu_us_per_room);
  }
  absl::StrAppend(&out, "rooms run: ", result.rooms_total, ", all succeeded on both sidecars\n");
  auto verdict = [](bool met) { return met ? "PASS" : "MISS"; };
  const ControlBenchRow* closed = nullptr;
  const ControlBenchRow* paced = nullptr;
  for (const ControlBenchRow& r : result.rows) {
    if (r.in_flight != result.target_in_flight) continue;
    if (r.rate == 0) closed = &r;
    if (r.rate == result.target_rooms_per_s) paced = &r;
  }
  if (closed == nullptr) {
    absl::StrAppendFormat(&out, "target: not measured (no closed-loop row at %d in flight)\n",
                          result.target_in_flight);
  } else {
    absl::StrAppendFormat(
        &out, "target at %d in flight: %.0f rooms/s vs >= %.0f %s; p99 %.3f ms vs <= %.3f ms %s\n",
        result.target_in_flight, closed->rooms_per_s, result.target_rooms_per_s,
        verdict(result.target_rooms_met), closed->p99_ms, result.target_p99_ms,
        verdict(result.target_p99_met));
    // Little's law: in a closed loop, mean latency = rooms in flight / rooms per second.
    absl::StrAppendFormat(
        &out,
        "  (closed loop: mean latency = in flight / rate, so a p99 <= %.3f ms at %d in flight "
        "needs >= %.0f rooms/s)\n",
        result.target_p99_ms, result.target_in_flight,
        result.target_in_flight / (result.target_p99_ms / 1000));
  }
  if (paced != nullptr) {
    absl::StrAppendFormat(
        &out, "target rate offered (%s): %.0f rooms/s carried %s; p99 %.3f ms vs <= %.3f ms %s\n",
        Mode(paced->in_flight, paced->rate), paced->rooms_per_s, verdict(result.paced_rate_met),
        paced->p99_ms, result.target_p99_ms, verdict(result.paced_p99_met));
  }
  return out;
}

std::string FormatControlBenchJson(const ControlBenchResult& result) {
  std::vector<std::string> rows;
  for (const ControlBenchRow& row : result.rows) {
    rows.push_back(absl::StrFormat(
        "{\"in_flight\":%d,\"rate\":%.1f,\"rooms\":%d,\"rooms_per_s\":%.1f,\"p50_ms\":%.4f,"
        "\"p99_ms\":%.4f,\"max_ms\":%.4f,\"seconds\":%.3f,\"cpu_us_per_room\":%.2f,"
        "\"capped\":%d}",
        row.in_flight, row.rate, row.rooms, row.rooms_per_s, row.p50_ms, row.p99_ms, row.max_ms,
        row.seconds, row.cpu_us_per_room, row.capped));
  }
  auto boolean = [](bool b) { return b ? "true" : "false"; };
  // The payload text is ours and holds no character JSON would need escaped.
  return absl::StrFormat(
      "{\"rows\":[%s],\"payload\":\"%s\",\"payload_bytes\":%d,\"rooms_total\":%d,"
      "\"target\":{\"in_flight\":%d,\"rooms_per_s\":%.1f,\"p99_ms\":%.3f,\"measured\":%s,"
      "\"rooms_per_s_met\":%s,\"p99_met\":%s,\"pass\":%s,\"paced_measured\":%s,"
      "\"paced_rate_met\":%s,\"paced_p99_met\":%s}}\n",
      absl::StrJoin(rows, ","), result.payload, result.payload_bytes, result.rooms_total,
      result.target_in_flight, result.target_rooms_per_s, result.target_p99_ms,
      boolean(result.target_measured), boolean(result.target_rooms_met),
      boolean(result.target_p99_met),
      boolean(result.target_measured && result.target_rooms_met && result.target_p99_met),
      boolean(result.paced_measured), boolean(result.paced_rate_met),
      boolean(result.paced_p99_met));
}

absl::Status RunControlBench(const ControlBenchOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(ControlBenchResult result, MeasureControlBench(options));
  const std::string text =
      options.json ? FormatControlBenchJson(result) : FormatControlBenchTable(result);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace kvrail::bench
