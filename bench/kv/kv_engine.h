// The bench engine of `kvrail bench kv`: in this process, it is every prefill and decode engine
// rank of one case. It starts the real product path as processes (tools/demo Cluster: a
// bootstrap server, P prefill and D decode sidecars), attaches an arena to each sidecar
// through the engine API (AttachArena.allocate_bytes, mapped here), fills the prefill arenas
// with the engine-sim's pattern, and runs rooms one at a time: Expect on every decode, Ready
// on every prefill once each has its pre-allocations, then waits for the decode's RoomEvents.
// It computes nothing while a room is timed; the sidecars plan and move the bytes.
//
// Every room is checked against the pattern after it lands: the first room of a case every
// byte, each later one a sample (RankLayout::CheckSample). The decode arenas are zeroed
// before each room (untimed), so a sample can only pass if that room's bytes landed.
//
// Time to the first byte: a thread polls the first 8 bytes of the room's first copy on decode
// rank 0 (field layer.0.*, block 1, offset 0: the decode arena is zero there until the write
// lands) from just before the Ready calls, every 50 microseconds (SCHED_FIFO where permitted),
// and stamps when they turn non-zero (the pattern's 8 bytes are all zero with probability
// 2^-64). The first room of a
// case runs on a fresh connection: new sidecars, whose registration (CachePD) completes before
// the timing starts, but whatever the prefill sets up on its first transfer to a new peer falls
// inside it; later rooms run on a warm one.
#ifndef KVRAIL_BENCH_KV_KV_ENGINE_H_
#define KVRAIL_BENCH_KV_KV_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/cluster.h"
#include "control/layout/kv_shape.h"

namespace kvrail::bench {

struct KvCaseSpec {
  std::string kvrail;  // the kvrail binary, for the sidecars and the bootstrap
  layout::KvShape shape;
  int prefill_tp = 1;
  int decode_tp = 1;
  int64_t tokens = 0;
  std::string link = "tcp";  // tcp, shm, or netns (tcp between two network namespaces)
  // netns: where each node runs (tools/demo Cluster); unused otherwise.
  cluster::NodeHost prefill_node, decode_node;
  int sample_every = 16;
  // Layer-wise streaming (CACHEPD §6.11, engine API LayersReady): 0 runs the default mode (one
  // Ready per room). N > 0: the bench engine simulates a forward pass of `layer_compute` per
  // layer and, after every N layers, tells each prefill rank that they are final
  // (LayersReady); the room's Ready follows its last layer's compute.
  int layer_step = 0;
  absl::Duration layer_compute = absl::ZeroDuration();
  // Passed to every sidecar (e.g. {"--naive-copies"}).
  std::vector<std::string> sidecar_args;
  // The sidecars' stderr goes to <log_dir>/<process>.log (tools/demo Cluster).
  std::string log_dir;
};

struct KvRoomFigures {
  uint64_t bytes = 0;              // the prefill ranks' RoomEvent.bytes, summed
  uint64_t coalesced_copies = 0;   // the prefill ranks' RoomEvent.copies, summed
  double data_plane_seconds = 0;   // the slowest prefill rank's RoomEvent.seconds
  double latency_seconds = 0;      // first Ready call to the last decode RoomEvent
  double first_byte_seconds = -1;  // first Ready call to the first byte landed; -1: not seen
  uint64_t bytes_checked = 0;      // decode bytes compared with the pattern
  // Layer-wise rooms: the Ready calls (after the last layer's compute) to the last decode
  // RoomEvent, the transfer time the overlap left exposed. -1 in the default mode.
  double exposed_seconds = -1;
  // The CPU seconds each side's sidecars used from the room's Expect to its last event (every
  // rank's process, all its threads; /proc/<pid>/stat).
  double prefill_cpu_seconds = 0;
  double decode_cpu_seconds = 0;
};

// A case's rooms, as its runner measured them.
struct KvCaseFigures {
  std::vector<KvRoomFigures> rooms;  // in order; rooms[0] ran on a fresh connection
  uint64_t uncoalesced_copies = 0;   // KvCaseRunner::uncoalesced_copies
};

// One case's cluster and engines, started and attached, its prefill arenas filled; it runs
// rooms one at a time. Stopping it (its destruction) stops the cluster.
class KvCaseRunner {
 public:
  // InvalidArgument when the shape does not split over a TP size or a count is not positive;
  // the cluster's error when a process cannot start or an attach fails.
  static absl::StatusOr<std::unique_ptr<KvCaseRunner>> Start(const KvCaseSpec& spec);
  ~KvCaseRunner();
  KvCaseRunner(const KvCaseRunner&) = delete;
  KvCaseRunner& operator=(const KvCaseRunner&) = delete;

  // Runs the next room (the first: on a fresh connection, checked whole) and checks it.
  // Internal naming the room and rank when it fails or is refused; DataLoss from the check
  // when it landed wrong bytes; DeadlineExceeded when it stalls 60 s.
  absl::StatusOr<KvRoomFigures> NextRoom();

  // Copies per room before coalescing, from the planner (control/plan CopyPlan::CountCopies)
  // on the bench's side, for the report only: the sidecars report only the coalesced count.
  uint64_t uncoalesced_copies() const;

 private:
  class Impl;
  KvCaseRunner() = default;
  std::unique_ptr<Impl> impl_;
  uint64_t rooms_run_ = 0;
};

}  // namespace kvrail::bench

#endif  // KVRAIL_BENCH_KV_KV_ENGINE_H_
