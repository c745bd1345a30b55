// A disaggregated deployment on this machine, as processes: one bootstrap server (the prefill
// node's), P prefill sidecars and D decode sidecars, each with its engine-sim, or without
// engine-sims for a caller that is the engine itself. The one harness of kvrail's processes: the
// demo and the soak run rooms through it, `kvrail bench kv` drives its sidecars, the end-to-end
// tests kill parts of it and speak CachePD to it, and the fault tests (tests/chaos/deployment.h)
// break it while they watch every byte.
#ifndef KVRAIL_CLUSTER_CLUSTER_H_
#define KVRAIL_CLUSTER_CLUSTER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/node_host.h"
#include "cluster/process/subprocess.h"
#include "control/layout/kv_shape.h"

namespace kvrail::cluster {

struct ClusterOptions {
  std::string kvrail;  // the kvrail binary
  int prefill_tp = 2;
  int decode_tp = 1;
  // Decode instances, each decode_tp ranks with a CachePD identity of its own (data-parallel
  // decodes): the fault tests' several decodes. Engine-sims serve one (engine_sims false for
  // more).
  int decode_instances = 1;
  int prefill_pp = 1;          // pipeline stages of the prefill node (CACHEPD §10.1)
  std::string link = "shm";    // shm or tcp (UCX), or verbs (SidecarCommand::link)
  std::string verbs_provider;  // verbs: passed to the sidecars when not empty
  // Who allocates each rank's KV arena: "sidecar" (on its data plane, where peers write it
  // fastest) or "engine" (the engine-sim, in POSIX shared memory).
  std::string arena = "sidecar";
  layout::KvShape shape;  // pages: per rank
  int decode_tokens = 8;
  // The CachePD revision each process is pinned to (--cachepd-revision: "snapshot", "2026-09");
  // empty: auto, the default. prefill_revisions holds one entry per prefill rank (global,
  // stage-major) or one for all. For interop tests: a peer of each revision in each role.
  std::string bootstrap_revision;
  std::vector<std::string> prefill_revisions;
  std::string decode_revision;
  // Passed to every sidecar (e.g. {"--heartbeat-interval", "2"}), and to every engine-sim.
  std::vector<std::string> sidecar_args;
  std::vector<std::string> sim_args;
  // Added after sidecar_args to one role's sidecars; passed to the bootstrap server; added to
  // the prefill sidecars' environment (e.g. MALLOC_ARENA_MAX).
  std::vector<std::string> prefill_args, decode_args, bootstrap_args;
  std::map<std::string, std::string> prefill_env;
  // Where each process's stderr goes: empty inherits; otherwise <dir>/<name>.log.
  std::string log_dir;
  // Where the prefill node (its bootstrap and sidecars) and the decode node run: by default
  // both on this host's loopback; `bench kv --link netns` puts each in a network
  // namespace of its own.
  NodeHost prefill_node, decode_node;
  // False: the bootstrap and the sidecars only, for a caller that drives the sidecars' engine
  // API itself (`kvrail bench kv`); the engine-sim options above are then unused.
  bool engine_sims = true;
  // The bootstrap server and every sidecar serve GET /metrics (--metrics-port 0, bound to their
  // node's host); each Member's `metrics` says where.
  bool metrics = false;
};

// One process of the cluster and its role.
struct Member {
  std::string name;  // "bootstrap", "prefill-sidecar-0", "decode-sim-1", ...
  std::unique_ptr<process::Subprocess> process;
  std::string engine_endpoint;    // sidecars
  std::string cachepd_endpoint;   // sidecars
  std::string arena_placement;    // engine-sims: where the arena lives ("ucx-shm", "posix-shm")
  std::string metrics;            // with ClusterOptions::metrics: "host:port" of GET /metrics
  std::string session_id;         // decode sidecars: the data-plane session (handshake endpoint)
  std::string log;                // where its stderr goes (ClusterOptions::log_dir); "" inherits
  std::vector<std::string> argv;  // how it was started (a restart starts it so again)
  std::map<std::string, std::string> env;  // and with which environment
};

// The name of sidecar `index` of `role` ("prefill" or "decode"; the index is global, stage- or
// instance-major): its Member::name, and its log's name (<log_dir>/<name>.log).
std::string SidecarName(const std::string& role, int index);

// The last `count` lines of a member's log (Member::log), each indented "    | ", for a
// failure's context; "(<path> is empty)" when it has none.
std::string LogTail(const std::string& path, int count);

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  ~Cluster();  // Stop()

  // "127.0.0.1:<port>" of the bootstrap server.
  const std::string& bootstrap() const { return bootstrap_; }
  int prefill_ranks() const { return options_.prefill_tp * options_.prefill_pp; }
  int decode_ranks() const { return options_.decode_tp * options_.decode_instances; }

  Member& bootstrap_server() { return bootstrap_member_; }
  Member& prefill_sidecar(int rank) { return prefill_sidecars_[rank]; }
  // Decode sidecars by global index: instance * decode_tp + rank.
  Member& decode_sidecar(int index) { return decode_sidecars_[index]; }
  // Engine-sims: prefill ranks first (0..prefill_ranks()-1), then decode ranks.
  Member& sim(int index) { return sims_[index]; }
  int sim_count() const { return static_cast<int>(sims_.size()); }
  bool IsPrefillSim(int index) const { return index < prefill_ranks(); }

  // Tells engine-sim `index` to run a room.
  void Send(int index, uint64_t room, int64_t prompt, int64_t token);
  // Tells every engine-sim.
  void SendAll(uint64_t room, int64_t prompt, int64_t token);
  // The next stdout line of any engine-sim, with its index; false on timeout.
  bool NextLine(absl::Duration timeout, std::pair<int, std::string>& out);

  // Kills engine-sim `index` (SIGKILL, as a crash) and starts it again, attached to the same
  // sidecar. Lines it printed before it died still come from NextLine, under the same index.
  absl::Status RestartSim(int index);
  // Kills prefill sidecar `rank` (global, stage-major) and its engine-sim (SIGKILL), and starts
  // both again: the new sidecar registers with the bootstrap server anew.
  absl::Status RestartPrefillSidecar(int rank);

  // Kills the bootstrap server (SIGKILL) and starts a new one on the same port: it has forgotten
  // every registration.
  absl::Status RestartBootstrap();
  // Kills decode sidecar `index` (SIGKILL, as a crash) and starts it again with the same flags:
  // a new process with a new session id, whose engine must attach again (no engine-sim is
  // restarted: for a caller that is the engine).
  absl::Status RestartDecodeSidecar(int index);

  // Closes the engine-sims' stdin and waits for them, then stops the services (a stopped one is
  // continued first). Idempotent.
  void Stop();

 private:
  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {}
  absl::Status StartAll();
  absl::StatusOr<Member> Spawn(const std::string& name, std::vector<std::string> argv,
                               const std::map<std::string, std::string>& env = {});
  // Starts a sidecar or engine-sim from its argv and reads its first line.
  absl::StatusOr<Member> StartSidecar(const std::string& name, std::vector<std::string> argv,
                                      const std::map<std::string, std::string>& env = {});
  absl::StatusOr<Member> StartSim(const std::string& name, std::vector<std::string> argv);
  // What `member`, which did not say it was ready (`why`), tells of its failure: its exit
  // status and the last error line of its log; the error names the member.
  static absl::Status StartFailure(Member& member, const absl::Status& why);
  void Watch(int index);
  void Unwatch(int index);  // joins the reader of a dead engine-sim

  ClusterOptions options_;
  std::string tag_, dir_, bootstrap_;
  size_t bootstrap_port_arg_ = 0;  // where the port is in the bootstrap server's argv
  Member bootstrap_member_;
  std::vector<Member> prefill_sidecars_, decode_sidecars_, sims_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::string>> lines_;
  std::vector<std::thread> readers_;  // one per engine-sim, by index
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
};

}  // namespace kvrail::cluster

#endif  // KVRAIL_CLUSTER_CLUSTER_H_
