#include "control/sidecar/sidecar_metrics.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/metrics/build_info.h"

namespace kvrail::sidecar {
namespace {

constexpr size_t kMaxClocks = size_t{1} << 20;  // rooms timed at once; more go untimed
constexpr size_t kMaxReasonChars = 200;

}  // namespace

std::string StatusCause(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kInvalidArgument:
      return "bounds";
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kFailedPrecondition:
      return "refused";
    default:
      return "other";
  }
}

SidecarMetrics::SidecarMetrics()
    : info_(registry_.AddGauge("kvrail_sidecar_info", "This sidecar: role, rank, session, version",
                               {"role", "tp_rank", "session", "version"})),
      rooms_(registry_.AddCounter("kvrail_rooms_total", "Rooms ended, by outcome and cause",
                                  {"outcome", "cause"})),
      room_duration_(registry_
                         .AddHistogram("kvrail_room_duration_seconds",
                                       "From a room's begin (or pre-allocation) to its end",
                                       metrics::LatencyBuckets())
                         .With()),
      first_byte_(registry_
                      .AddHistogram("kvrail_room_first_byte_seconds",
                                    "Prefill: Ready to its first writes completed; decode: "
                                    "pre-allocation to its first Success",
                                    metrics::LatencyBuckets())
                      .With()),
      bytes_(registry_.AddCounter("kvrail_bytes_total",
                                  "Prefill: bytes written per decode session and lane",
                                  {"peer", "lane"})),
      writes_(registry_.AddCounter("kvrail_writes_total",
                                   "Prefill: writes completed per decode session and lane",
                                   {"peer", "lane"})),
      write_errors_(registry_.AddCounter("kvrail_write_errors_total",
                                         "Prefill: transfers failed, by cause", {"cause"})),
      handshake_errors_(registry_.AddCounter(
          "kvrail_handshake_errors_total",
          "Prefill: descriptor fetches and connects that failed, by cause", {"cause"})),
      handshake_duration_(registry_
                              .AddHistogram("kvrail_handshake_duration_seconds",
                                            "Prefill: a decode session's descriptor fetch",
                                            metrics::LatencyBuckets())
                              .With()),
      connect_duration_(registry_
                            .AddHistogram("kvrail_connect_duration_seconds",
                                          "Prefill: the data plane's connect to a decode session",
                                          metrics::LatencyBuckets())
                            .With()),
      fences_(registry_.AddCounter("kvrail_fences_total", "Failed rooms fenced").With()),
      sessions_dropped_(registry_.AddCounter("kvrail_sessions_dropped_total",
                                             "Prefill: decode sessions dropped, by why", {"why"})),
      fence_duration_(registry_
                          .AddHistogram("kvrail_fence_duration_seconds",
                                        "From a failed room's fence to its end",
                                        metrics::LatencyBuckets())
                          .With()),
      arena_bytes_(registry_.AddGauge("kvrail_arena_bytes", "The attached arena, by placement",
                                      {"placement"})),
      bytes_in_flight_(
          registry_
              .AddGauge("kvrail_bytes_in_flight", "Prefill: bytes posted and not yet completed")
              .With()),
      last_failure_(registry_.AddGauge(
          "kvrail_last_failure_info",
          "The last room failure (value: its unix time), replaced by each failure",
          {"cause", "room", "reason"})) {
  // Present at 0 from the start, so that a rate over the first rooms sees them.
  rooms_.With({"succeeded", ""});
}

void SidecarMetrics::SetInfo(const std::string& role, int tp_rank, const std::string& session) {
  info_.Clear();
  info_.With({role, absl::StrCat(tp_rank), session, metrics::kKvrailVersion}).Set(1);
}

void SidecarMetrics::SetStatsSource(std::function<SidecarStats()> stats) {
  registry_.AddCollector([stats = std::move(stats)](std::vector<metrics::MetricFamily>& out) {
    const SidecarStats s = stats();
    metrics::MetricFamily tables{"kvrail_table_entries",
                                 "Entries in the sidecar's tables now",
                                 metrics::MetricType::kGauge,
                                 {}};
    const auto table = [&tables](const char* name, uint64_t value) {
      tables.samples.push_back({"", {{"table", name}}, static_cast<double>(value)});
    };
    table("rooms", s.rooms);
    table("registrations", s.registrations);
    table("fences", s.fences);
    table("transfers", s.transfers);
    table("finished_remembered", s.finished_remembered);
    table("failed_rooms_remembered", s.failed_rooms_remembered);
    table("outbox_peers", s.outbox_peers);
    table("data_plane_peers", s.data_plane_peers);
    table("endpoints", s.endpoints);
    table("regions", s.regions);
    table("registrations_held", s.registrations_held);
    table("scheduler_transfers", s.scheduler_transfers);
    table("scheduler_peers", s.scheduler_peers);
    table("strands", s.strands);
    table("engines", s.engines);
    out.push_back(std::move(tables));
    // SidecarStats' counters that no metric above counts already.
    const auto counter = [&out](const char* name, const char* help, uint64_t value) {
      out.push_back({absl::StrCat("kvrail_", name, "_total"),
                     help,
                     metrics::MetricType::kCounter,
                     {{"", {}, static_cast<double>(value)}}});
    };
    counter("peer_messages", "CachePD messages received", s.peer_messages);
    counter("peer_messages_rejected", "CachePD messages refused", s.peer_messages_rejected);
    counter("bytes_sent", "Prefill: bytes landed at decode ranks", s.bytes_sent);
    counter("pages_unproven", "Decode: rooms whose pages were released without every fence",
            s.pages_unproven);
    counter("bootstrap_registrations", "Prefill: accepted PUT /route", s.bootstrap_registrations);
    counter("registrations_refused", "Prefill: registrations refused by their descriptor",
            s.registrations_refused);
    counter("room_digests", "--verify-digest: digests sent (prefill) or matched (decode)",
            s.room_digests);
    counter("room_digests_failed", "--verify-digest, decode: rooms failed by their digest",
            s.room_digests_failed);
    counter("rows_scattered", "Decode: prefill ranks' staged rows scattered into the pages",
            s.rows_scattered);
    counter("row_staging_full", "Decode: row staging offers not made for want of a free slot",
            s.row_staging_full);
    counter("row_staging_quarantined",
            "Decode: row staging slots kept out of use after an unproven fence",
            s.row_staging_quarantined);
    counter("rail_failovers", "Data-plane rail failovers", s.rail_failovers);
    counter("lane_wakes_by_event",
            "Data-plane lanes (UCX): sleeps ended by the worker's event (a peer's message, a "
            "socket that takes more bytes)",
            s.lane_wakes_by_event);
    counter("lane_wakes_by_job", "Data-plane lanes (UCX): sleeps ended by a queued job",
            s.lane_wakes_by_job);
    counter("lane_naps_ended", "Data-plane lanes (UCX): sleeps that lasted their 1 ms nap",
            s.lane_naps_ended);
    counter("writes_stored_together",
            "Data-plane lanes (UCX over shared memory): writes stored a source row at a time with "
            "other peers' writes of slices of the same rows",
            s.writes_stored_together);
  });
}

SidecarMetrics::RoomClock* SidecarMetrics::ClockLocked(uint64_t room, absl::Time now) {
  auto it = clocks_.find(room);
  if (it != clocks_.end()) return &it->second;
  if (clocks_.size() >= kMaxClocks) return nullptr;
  return &clocks_.emplace(room, RoomClock{now}).first->second;
}

void SidecarMetrics::RoomSeen(uint64_t room, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  ClockLocked(room, now);
}

void SidecarMetrics::RoomReady(uint64_t room, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (RoomClock* clock = ClockLocked(room, now)) {
    if (clock->ready == absl::InfinitePast()) clock->ready = now;
  }
}

void SidecarMetrics::RoomFirstByte(uint64_t room, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clocks_.find(room);
  if (it == clocks_.end() || it->second.first_byte) return;
  it->second.first_byte = true;
  const absl::Time from =
      it->second.ready != absl::InfinitePast() ? it->second.ready : it->second.began;
  first_byte_.Observe(absl::ToDoubleSeconds(now - from));
}

void SidecarMetrics::RoomEnded(uint64_t room, bool succeeded, session::FailureCause failure,
                               const std::string& reason, absl::Time now) {
  const std::string cause(succeeded ? "" : session::FailureCauseLabel(failure));
  rooms_.With({succeeded ? "succeeded" : "failed", cause}).Add();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clocks_.find(room);
  if (it != clocks_.end()) {
    room_duration_.Observe(absl::ToDoubleSeconds(now - it->second.began));
    clocks_.erase(it);
  }
  if (!succeeded) {
    last_failure_.Clear();
    last_failure_.With({cause, absl::StrCat(room), reason.substr(0, kMaxReasonChars)})
        .Set(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  }
}

void SidecarMetrics::FenceBegan(uint64_t room, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (RoomClock* clock = ClockLocked(room, now)) {
    if (clock->fence_began == absl::InfinitePast()) clock->fence_began = now;
  }
}

void SidecarMetrics::FenceEnded(uint64_t room, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clocks_.find(room);
  if (it == clocks_.end() || it->second.fence_began == absl::InfinitePast()) return;
  fences_.Add();
  fence_duration_.Observe(absl::ToDoubleSeconds(now - it->second.fence_began));
  it->second.fence_began = absl::InfinitePast();
}

void SidecarMetrics::SessionDropped(const std::string& session, const std::string& why) {
  sessions_dropped_.With({why}).Add();
  bytes_.RemoveWhere(0, session);
  writes_.RemoveWhere(0, session);
}

void SidecarMetrics::FenceObserved(absl::Duration waited) {
  fences_.Add();
  fence_duration_.Observe(absl::ToDoubleSeconds(waited));
}

void SidecarMetrics::WriteFailed(const absl::Status& status) {
  write_errors_.With({StatusCause(status)}).Add();
}

void SidecarMetrics::HandshakeDone(absl::Duration took, const absl::Status& status) {
  handshake_duration_.Observe(absl::ToDoubleSeconds(took));
  if (!status.ok()) handshake_errors_.With({StatusCause(status)}).Add();
}

void SidecarMetrics::ConnectDone(absl::Duration took, const absl::Status& status) {
  connect_duration_.Observe(absl::ToDoubleSeconds(took));
  if (!status.ok()) handshake_errors_.With({StatusCause(status)}).Add();
}

void SidecarMetrics::SetArena(const std::string& placement, uint64_t bytes) {
  arena_bytes_.Clear();
  if (bytes > 0) arena_bytes_.With({placement}).Set(static_cast<double>(bytes));
}

std::function<void(const transfer::BatchEvent&)> SidecarMetrics::BatchCounter(
    uint64_t room, const std::string& peer, int lanes) {
  struct Lanes {
    // Held, not borrowed: ForgetPeer may remove the series while a transfer still counts.
    std::vector<std::shared_ptr<metrics::Counter>> bytes;
    std::vector<std::shared_ptr<metrics::Counter>> writes;
    std::atomic<bool> first_byte{false};
  };
  auto counters = std::make_shared<Lanes>();
  for (int lane = 0; lane < lanes; ++lane) {
    counters->bytes.push_back(bytes_.Share({peer, absl::StrCat(lane)}));
    counters->writes.push_back(writes_.Share({peer, absl::StrCat(lane)}));
  }
  return [this, room, counters](const transfer::BatchEvent& batch) {
    if (!batch.completed) {
      bytes_in_flight_.Add(static_cast<double>(batch.bytes));
      return;
    }
    bytes_in_flight_.Add(-static_cast<double>(batch.bytes));
    if (!batch.ok) return;
    const size_t lane = static_cast<size_t>(batch.lane);
    if (lane < counters->bytes.size()) {
      counters->bytes[lane]->Add(batch.bytes);
      counters->writes[lane]->Add(batch.writes);
    }
    if (!counters->first_byte.exchange(true)) RoomFirstByte(room, absl::Now());
  };
}

}  // namespace kvrail::sidecar
