// What a sidecar exposes at GET /metrics (`kvrail sidecar --metrics-port`; names in README.md,
// "Metrics"): rooms by outcome and cause, room and first-byte latency, bytes and writes per peer
// and lane, write and handshake errors, handshake and connect latency, fences, table sizes,
// arena bytes, bytes in flight, and the last failure.
//
// Counting is atomics on series looked up once; the room clocks (when each live room began) sit
// behind this object's own small mutex, never the sidecar's room mutex, so counting under that
// mutex costs a hash-map operation at most. Table sizes and SidecarStats' counters are read at
// scrape time from a callback (SetStatsSource), not counted twice.
#ifndef KVRAIL_CONTROL_SIDECAR_SIDECAR_METRICS_H_
#define KVRAIL_CONTROL_SIDECAR_SIDECAR_METRICS_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "control/session/failure_cause.h"
#include "control/sidecar/sidecar.h"
#include "engine/metrics/registry.h"
#include "engine/transfer/scheduler.h"

namespace kvrail::sidecar {

// The cause label of a failed write or handshake, from its status: timeout, cancelled,
// unavailable, bounds, refused, other.
std::string StatusCause(const absl::Status& status);

class SidecarMetrics {
 public:
  SidecarMetrics();
  SidecarMetrics(const SidecarMetrics&) = delete;
  SidecarMetrics& operator=(const SidecarMetrics&) = delete;

  const metrics::Registry& registry() const { return registry_; }

  // kvrail_sidecar_info{role, tp_rank, session, version} 1.
  void SetInfo(const std::string& role, int tp_rank, const std::string& session);
  // Called at each scrape for the table sizes and the SidecarStats counters; must not block
  // for long. Set once, before the first scrape.
  void SetStatsSource(std::function<SidecarStats()> stats);

  // A room's clock starts at the first of these for it (Begin, Expect, a pre-allocation, an
  // event); `Ready` (prefill) restarts its first-byte clock.
  void RoomSeen(uint64_t room, absl::Time now);
  void RoomReady(uint64_t room, absl::Time now);
  // The room's first bytes: prefill, its first batch of writes completed; decode, its first
  // Success from a prefill rank. Only the first call per room counts.
  void RoomFirstByte(uint64_t room, absl::Time now);
  // The room ended: counted by outcome and cause, its duration observed when its clock ran,
  // and a failure becomes kvrail_last_failure_info (`unix_seconds` its value).
  // `cause` is the room's (session::FailureCauseLabel): never free text, a label's values stay
  // few.
  void RoomEnded(uint64_t room, bool succeeded, session::FailureCause cause,
                 const std::string& reason, absl::Time now);

  // Prefill: a failed room's transfer is being fenced; its fence ended (observed then).
  void FenceBegan(uint64_t room, absl::Time now);
  void FenceEnded(uint64_t room, absl::Time now);
  // Decode: a failed room's fence took `waited` (PagesRelease).
  void FenceObserved(absl::Duration waited);

  // Prefill: a decode session dropped, `why` one of refused (its port refuses connections),
  // other_process (its port answers for another process), silent (--registration-ttl) and
  // registry (its registry entry expired). Its kvrail_bytes_total and kvrail_writes_total
  // series go with it: decodes restarting under new session ids grow no series.
  void SessionDropped(const std::string& session, const std::string& why);

  void WriteFailed(const absl::Status& status);
  void HandshakeDone(absl::Duration took, const absl::Status& status);
  void ConnectDone(absl::Duration took, const absl::Status& status);
  void SetArena(const std::string& placement, uint64_t bytes);

  // A transfer's on_batch (scheduler.h) for `room` to `peer` over `lanes` lanes: counts its
  // bytes and writes per lane as they complete, the bytes in flight, and the room's first byte.
  std::function<void(const transfer::BatchEvent&)> BatchCounter(uint64_t room,
                                                                const std::string& peer, int lanes);

 private:
  struct RoomClock {
    absl::Time began;
    absl::Time ready = absl::InfinitePast();
    bool first_byte = false;
    absl::Time fence_began = absl::InfinitePast();
  };
  RoomClock* ClockLocked(uint64_t room, absl::Time now);

  metrics::Registry registry_;
  metrics::Family<metrics::Gauge>& info_;
  metrics::Family<metrics::Counter>& rooms_;
  metrics::Histogram& room_duration_;
  metrics::Histogram& first_byte_;
  metrics::Family<metrics::Counter>& bytes_;
  metrics::Family<metrics::Counter>& writes_;
  metrics::Family<metrics::Counter>& write_errors_;
  metrics::Family<metrics::Counter>& handshake_errors_;
  metrics::Histogram& handshake_duration_;
  metrics::Histogram& connect_duration_;
  metrics::Counter& fences_;
  metrics::Family<metrics::Counter>& sessions_dropped_;
  metrics::Histogram& fence_duration_;
  metrics::Family<metrics::Gauge>& arena_bytes_;
  metrics::Gauge& bytes_in_flight_;
  metrics::Family<metrics::Gauge>& last_failure_;

  std::mutex mu_;  // guards clocks_; also serialises replacing the last failure
  absl::flat_hash_map<uint64_t, RoomClock> clocks_;
};

}  // namespace kvrail::sidecar

#endif  // KVRAIL_CONTROL_SIDECAR_SIDECAR_METRICS_H_
