// A prefill and a decode kvrail sidecar as real processes, with their bootstrap server, for the
// fault tests of tests/chaos: the processes are a cluster::Cluster without engine-sims (the one
// harness of kvrail's processes, cluster/cluster.h); the test itself is both engines (engine API
// clients over the sidecars' sockets), owns both KV arenas (POSIX shared memory) and so can
// watch every byte of the decode's pages while it breaks things.
#ifndef KVRAIL_TESTS_CHAOS_DEPLOYMENT_H_
#define KVRAIL_TESTS_CHAOS_DEPLOYMENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cluster/cluster.h"
#include "cluster/process/subprocess.h"
#include "control/engine_api/engine_api.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "engine/memory/arena.h"

namespace kvrail::chaos {

struct DeploymentOptions {
  // The sidecars' data plane: UCX "tcp" or "sm", or "verbs" (the verbs backend over the
  // software provider, its rail on the net devices below)
  std::string tls = "tcp";
  int decodes = 1;      // decode sidecars (each TP 1, with its own arena)
  int64_t pages = 128;  // per arena; a block is 2 MiB (32 layers of k and v, bf16)
  std::vector<std::string> prefill_args;           // extra sidecar flags
  std::map<std::string, std::string> prefill_env;  // added to the prefill sidecar's environment
  std::vector<std::string> decode_args;
  std::vector<std::string> bootstrap_args;  // extra `kvrail bootstrap` flags
  // `ip netns exec` wrappers and addresses, for sidecars in network namespaces: empty runs on
  // the host's loopback.
  std::vector<std::string> prefill_prefix, decode_prefix;
  std::string prefill_host = "127.0.0.1", decode_host = "127.0.0.1";
  std::string net_devices = "lo";  // the prefill's UCX tcp device
  std::string decode_net_devices = "lo";
};

// A prefill and two decodes (TP 1, 33 pages each) over `tls`, quick to see a stopped peer:
// short deadlines and fence bounds, frequent probes. faults_test and isolation_test start it.
DeploymentOptions TwoDecodes(const char* tls);

// One sidecar process and the test as its engine.
struct Rank {
  std::string name;
  process::Subprocess* sidecar = nullptr;  // the cluster's process (a restart replaces it)
  std::unique_ptr<engine_api::EngineApiClient> engine;
  std::optional<Arena> arena;
  std::string arena_name;
  std::string engine_endpoint;
  std::string cachepd_endpoint;  // its CachePD PULL socket, tcp://host:port
  std::string session_id;        // a decode's data-plane session (its handshake endpoint)
  std::string engine_token;      // from the sidecar's first AttachArena reply: for a takeover
};

class Deployment {
 public:
  // Starts the bootstrap server and the sidecars, attaches the arenas (the prefill's filled
  // with a pattern, the decodes' zeroed) and moves one small room to each decode so that every
  // handshake and connection is made.
  static absl::StatusOr<std::unique_ptr<Deployment>> Start(DeploymentOptions options);
  ~Deployment();

  const layout::Contract& contract() const { return contract_; }
  const std::string& bootstrap() const { return bootstrap_address_; }
  Rank& prefill() { return prefill_; }
  Rank& decode(int i) { return decodes_[i]; }
  process::Subprocess& bootstrap_server() { return *cluster_->bootstrap_server().process; }
  // Kills the bootstrap server (SIGKILL) and starts a new one on the same port: it has
  // forgotten every registration.
  absl::Status RestartBootstrap();

  // The manifest of `blocks` consecutive blocks from `first`.
  layout::Manifest Blocks(int64_t first, int64_t blocks) const;
  // Expect on decode `d` (asynchronously: its reply is skipped), then Ready on the prefill.
  absl::Status Expect(int d, uint64_t room, const layout::Manifest& manifest);
  absl::Status Ready(uint64_t room, const layout::Manifest& manifest);
  absl::Status Abort(Rank& rank, uint64_t room, const std::string& reason);
  // A whole room to decode `d`: Expect, Ready, its Success on both sides, and its bytes
  // landed exactly. The error says which of them failed.
  absl::Status MoveRoom(int d, uint64_t room, const layout::Manifest& manifest,
                        absl::Duration timeout = absl::Seconds(60));
  // The next event of `room` on `rank` (others are kept for later calls).
  absl::StatusOr<v1::RoomEvent> Event(Rank& rank, uint64_t room, absl::Duration timeout);
  // Waits until decode `d`'s pages of `room` are the engine's again: its Failed event with
  // PAGES_REUSABLE, or the later release. Returns that event.
  absl::StatusOr<v1::RoomEvent> PagesFree(int d, uint64_t room, absl::Duration timeout);
  // Whether decode `d`'s bytes of `manifest` equal the prefill's (the room landed exactly).
  bool Landed(int d, const layout::Manifest& manifest) const;
  // Bytes of decode `d`'s arena that differ from `before`.
  uint64_t Changed(int d, const std::vector<uint8_t>& before) const;
  // For pages just said free: fills decode `d`'s whole arena with a marker, waits `watch`, and
  // returns how many of its bytes a late write changed meanwhile.
  uint64_t OverwrittenWithin(int d, absl::Duration watch);
  std::vector<uint8_t> Snapshot(int d) const;
  // Kills decode `d`'s sidecar (SIGKILL, as a crash) and starts it again: same arena, new
  // session id; the test attaches it again as its engine would.
  absl::Status RestartDecode(int d);
  // The engine of decode `d` goes away (its socket closed, as a killed engine's is) and a new
  // one connects and attaches the same arena again.
  absl::Status ReconnectDecodeEngine(int d);
  // A Stats request to `rank`'s sidecar.
  absl::StatusOr<v1::SidecarStats> Stats(Rank& rank);
  // Where the log of `rank` is ("prefill", "decode<d>", or "bootstrap"): the cluster's log of
  // that process, in the test's outputs directory.
  static std::string LogPath(const std::string& rank);
  // The sidecar process's resident set (kB) and open file descriptors.
  static absl::StatusOr<std::pair<uint64_t, uint64_t>> RssAndFds(int pid);

 private:
  explicit Deployment(DeploymentOptions options) : options_(std::move(options)) {}
  absl::Status StartAll();
  // `rank` takes the sidecar process and endpoints of the cluster's `member`.
  static void Bind(Rank& rank, cluster::Member& member);
  absl::Status AttachRank(Rank& rank, bool prefill);

  DeploymentOptions options_;
  layout::Contract contract_;
  std::string tag_;
  std::string bootstrap_address_;
  std::unique_ptr<cluster::Cluster> cluster_;
  Rank prefill_;
  std::vector<Rank> decodes_;
  std::vector<std::pair<std::string, v1::RoomEvent>> kept_;  // rank name, event
};

// Blocks of 2 MiB: the room of `blocks` blocks moves blocks * 2 MiB.
inline constexpr uint64_t kBlockBytes = uint64_t{2} << 20;

}  // namespace kvrail::chaos

#endif  // KVRAIL_TESTS_CHAOS_DEPLOYMENT_H_
