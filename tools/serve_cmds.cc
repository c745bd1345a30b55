#include "tools/serve_cmds.h"

#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "control/bootstrap/bearer_token.h"
#include "control/layout/contract.h"
#include "control/layout/kv_shape.h"
#include "control/metrics_http/metrics_server.h"
#include "control/registry/metrics_entry.h"
#include "control/session/peer_log_limiter.h"
#include "control/sidecar/sidecar.h"
#include "engine/base/error.h"
#include "engine/zmq_auth/allowed_keys.h"
#include "tools/config_file.h"
#include "tools/demo/demo.h"
#include "tools/engine_sim/engine_sim.h"
#include "tools/json_log_format.h"
#include "tools/landing_stores_flag.h"
#include "tools/renamed_flag.h"

namespace kvrail::tools {
namespace {

using session::PeerLogLimiter;

int Report(const absl::Status& status, const char* what) {
  if (status.ok()) return 0;
  // "error: <what>: <category>: <message>", or with no category "error: <what>: <message>".
  const std::string described =
      CategoryOf(status) ? DescribeError(status) : std::string(status.message());
  std::fprintf(stderr, "error: %s: %s\n", what, described.c_str());
  return 1;
}

// Blocks until SIGINT or SIGTERM.
void WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int signal = 0;
  sigwait(&set, &signal);
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts: all inherit it
}

void AddShapeFlags(CLI::App* app, layout::KvShape& shape) {
  app->add_option("--layers", shape.layers, "Transformer layers")->capture_default_str();
  app->add_option("--kv-heads", shape.kv_heads, "KV heads (GQA)")->capture_default_str();
  app->add_option("--head-dim", shape.head_dim, "Dims per head")->capture_default_str();
  app->add_option("--page-tokens", shape.page_tokens, "Tokens per KV page")->capture_default_str();
  app->add_flag("--latent", shape.latent,
                "MLA-style: one replicated latent field per layer instead of k and v");
}

std::string SelfPath() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "kvrail";
  path[n] = '\0';
  return path;
}

}  // namespace

void AddSidecar(CLI::App& app, int& exit_code) {
  static sidecar::SidecarOptions options;
  static std::string role;
  static double bootstrap_timeout = 120, waiting_timeout = 300, heartbeat = 5,
                transfer_deadline = 60, handshake_timeout = 5, connect_timeout = 5,
                fence_timeout = 5, fence_wait = 10, registration_ttl = 60, preallocation_wait = 120;
  static int heartbeat_failures = 2;
  CLI::App* sub = app.add_subcommand(
      "sidecar", "Serve one engine rank: engine API, CachePD control plane, UCX data plane");
  sub->add_option("--role", role, "prefill or decode")
      ->required()
      ->check(CLI::IsMember({"prefill", "decode"}));
  sub->add_option("--engine-endpoint", options.engine_endpoint,
                  "Where the engine connects (ipc:///tmp/kvrail-p0.sock, tcp://127.0.0.1:N)")
      ->required();
  sub->add_option("--host", options.host,
                  "The address this sidecar's CachePD and handshake sockets bind (0.0.0.0: all)")
      ->capture_default_str();
  sub->add_option("--advertise-host", options.advertise_host,
                  "The address peers are told to reach this sidecar at (default: --host; with "
                  "--host 0.0.0.0, an address of this host). Checked at start: one of this "
                  "host's addresses that --host binds, or reachable from here");
  sub->add_option("--bootstrap", options.bootstrap,
                  "Prefill: host:port of the node's bootstrap server");
  sub->add_option("--tp-size", options.tp_size, "Attention TP size of this side")
      ->capture_default_str();
  sub->add_option("--tp-rank", options.tp_rank, "This rank")->capture_default_str();
  sub->add_option("--dp-size", options.dp_size, "Prefill: DP size")->capture_default_str();
  sub->add_option("--dp-rank", options.dp_rank, "Prefill: this rank's DP group")
      ->capture_default_str();
  sub->add_option("--pp-size", options.pp_size, "Prefill: pipeline stages of the node")
      ->capture_default_str();
  sub->add_option("--pp-rank", options.pp_rank, "Prefill: this rank's stage")
      ->capture_default_str();
  sub->add_option("--backend", options.backend,
                  "Data-plane backend: ucx, or verbs (raw RDMA writes over libibverbs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ucx", "verbs"}));
  AddRenamedFlag(sub, "--transport", "--backend (ucx or verbs)");
  AddRenamedFlag(
      sub, "--bootstrap-token-file",
      "--bootstrap-bearer-token-file (a bootstrap token is CachePD's first output token)");
  sub->add_option("--verbs-provider", options.verbs_provider,
                  "Verbs: libibverbs (RDMA devices) or softverbs (the software provider: shared "
                  "memory on this host, for tests, never hardware); default "
                  "$KVRAIL_VERBS_PROVIDER, else libibverbs")
      ->check(CLI::IsMember({"libibverbs", "softverbs"}));
  sub->add_option("--rdma-devices", options.rdma_devices,
                  "Verbs: RDMA devices to use as rails, in order (default: every active one)")
      ->delimiter(',');
  sub->add_option("--rail-affinity", options.rail_affinity,
                  "Verbs, without --rdma-devices: the NICs nearest the arena, gpu:<PCI address> "
                  "(the GPU's NIC on its PCIe switch) or numa:<node>, from /sys");
  sub->add_option("--gid-index", options.gid_index,
                  "Verbs: GID index on every rail (default: the first RoCE v2 IPv4 GID whose "
                  "netdev is up)");
  sub->add_option("--tls", options.tls, "UCX transports: tcp or sm (shared memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tcp", "sm"}));
  sub->add_option("--net-devices", options.net_devices, "UCX network device for tcp")
      ->capture_default_str();
  sub->add_option("--lanes", options.lanes, "Data-plane lanes (UCX workers)")
      ->capture_default_str();
  tools::AddLandingStoresFlag(
      sub, &options.landing_stores,
      "How kvrail's own copies store the bytes where they land (UCX lanes into a peer's "
      "shared-memory segment or a tcp target's region; a decode's scatter of staged rows): auto "
      "(non-temporal stores for a head-sliced room's rows, which land or are read apart, "
      "memcpy for the rest), plain (memcpy) or streaming (non-temporal "
      "stores); `bazel run -c opt //bench:row_landing_bench` shows which is faster on this host "
      "(docs/decisions/0018, 0019)");
  sub->add_option("--bootstrap-timeout", bootstrap_timeout, "Seconds (CACHEPD §7.4)")
      ->capture_default_str();
  sub->add_option("--waiting-timeout", waiting_timeout, "Seconds (CACHEPD §7.4)")
      ->capture_default_str();
  sub->add_option("--preallocation-wait", preallocation_wait,
                  "Prefill: seconds a pre-allocation waits for the engine to begin its room "
                  "before the room fails")
      ->capture_default_str();
  sub->add_option("--heartbeat-interval", heartbeat,
                  "Seconds between probes, at least 2 (CACHEPD §1.6). A decode tries the CachePD "
                  "socket of each prefill rank it waits on: one that refuses (its process died) "
                  "is dead at that probe, so within one interval")
      ->capture_default_str();
  sub->add_option("--heartbeat-failures", heartbeat_failures,
                  "Decode: consecutive failed /health probes of a prefill node's bootstrap server "
                  "that declare the whole node dead (a host gone silent: this many intervals; a "
                  "rank whose socket refuses is found at the first probe)")
      ->capture_default_str();
  sub->add_option("--transfer-deadline", transfer_deadline, "Seconds a room's writes may take")
      ->capture_default_str();
  sub->add_option("--handshake-timeout", handshake_timeout,
                  "Prefill: seconds a decode's descriptor fetch may take")
      ->capture_default_str();
  sub->add_option("--connect-timeout", connect_timeout,
                  "Prefill: seconds the data plane's connect to a decode may wait for its wireup")
      ->capture_default_str();
  sub->add_option("--fence-timeout", fence_timeout,
                  "Prefill: seconds a failed room's writes may take to drain before its decode "
                  "is disconnected (Failed is sent only once fenced)")
      ->capture_default_str();
  sub->add_option("--fence-wait", fence_wait,
                  "Decode: seconds a failed room's pages wait for the prefill ranks' fence "
                  "answers before they are released as not provably safe")
      ->capture_default_str();
  sub->add_option("--registration-ttl", registration_ttl,
                  "Prefill: seconds a decode session's handshake endpoint may go unanswered "
                  "before its registration and rooms are dropped")
      ->capture_default_str();
  static std::string bootstrap_bearer_token_file;
  sub->add_option("--bootstrap-bearer-token-file", bootstrap_bearer_token_file,
                  "Prefill: a file holding the bearer token the bootstrap server was started "
                  "with (its --bearer-token-file); sent with every PUT /route")
      ->check(CLI::ExistingFile);
  static std::string cachepd_revision = "auto";
  sub->add_option("--cachepd-revision", cachepd_revision,
                  "The CachePD revision to speak: auto (both: each peer is answered in the form "
                  "it sent), or snapshot / 2026-09 to behave as a peer of that revision alone "
                  "(interop tests; docs/PROTOCOL.md §12.12)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "snapshot", "2026-09"}));
  static std::string sender_proofs = "auto";
  sub->add_option("--sender-proofs", sender_proofs,
                  "Decode: which prefill nodes must prove their statuses and fence answers: auto "
                  "(kvrail nodes, as their bootstrap server says), required (all), off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "required", "off"}));
  static std::string curve_key, curve_allowed;
  sub->add_option("--curve-key", curve_key,
                  "CURVE on every socket: this sidecar's own .key (kvrail keygen; its role and "
                  "rank must be this sidecar's). With --curve-allowed; neither: no security")
      ->check(CLI::ExistingFile);
  sub->add_option("--curve-allowed", curve_allowed,
                  "CURVE: a directory of the *.pub keys this sidecar accepts")
      ->check(CLI::ExistingDirectory);
  sub->add_flag("--verify-digest", options.verify_digest,
                "Prefill: send kvrail decodes an XXH3-64 digest of each room's bytes before "
                "Success. Decode: check it against the bytes that landed, and refuse Success "
                "without one from kvrail nodes. Host arenas only (docs/SECURITY.md, Digests)");
  sub->add_option("--staging-chunk-bytes", options.staging_chunk_bytes,
                  "A CUDA arena over a transport without GPU access is staged through a host "
                  "mirror: the bytes of one pinned chunk (one cudaMemcpyAsync)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{4096}, uint64_t{1} << 30));
  sub->add_option("--staging-depth", options.staging_depth,
                  "Staging: pinned chunks in flight at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_flag("--emulate-gpu-arena", options.emulate_gpu_arena,
                "For testing without a GPU: stage an engine's shm_name arena through a host "
                "mirror with memcpy, as a CUDA arena over UCX is staged with cudaMemcpyAsync");
  sub->add_flag("--populate-arena,!--no-populate-arena", options.populate_arena,
                "Make every page of an arena this sidecar allocates resident at attach, so no "
                "room pays their first touch (the attach's log line says what it cost)")
      ->capture_default_str();
  sub->add_option("--row-staging-bytes", options.row_staging_bytes,
                  "Decode: offer prefill ranks this much registered host memory, a slot per "
                  "room, to write head-sliced rows into back to back; the decode scatters them "
                  "into the pages before Success counts (0: none; docs/PROTOCOL.md, Row staging)")
      ->capture_default_str();
  static std::string row_staging = "auto";
  sub->add_option("--row-staging", row_staging,
                  "Decode: the routes row staging serves: auto (rows that land apart, short, on "
                  "a transport that writes them one by one: verbs, UCX where it may choose "
                  "RDMA), all (every route whose rows land apart)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "all"}));
  sub->add_flag("--naive-copies", options.naive_copies,
                "Prefill, for measurement: post one write per row per page per field, never "
                "merged (kvrail bench kv --naive measures what merging gains)");
  sub->add_flag("--no-strided-copies", options.no_strided_copies,
                "Prefill, for measurement: post each head-sliced row as a copy of its own, as "
                "before strided copies (kvrail bench kv --compare measures what they gain)");
  sub->add_option("--max-rooms", options.max_rooms,
                  "Prefill: the most rooms tracked at once; pre-allocations past it are "
                  "answered Failed (0: no bound)")
      ->capture_default_str();
  sub->add_option("--max-rooms-per-session", options.max_rooms_per_session,
                  "Prefill: the most rooms one decode session may pre-allocate at once; more are "
                  "answered Failed (0: no bound)")
      ->capture_default_str();
  static int metrics_port = -1;
  static std::string metrics_host = "127.0.0.1";
  sub->add_option("--metrics-port", metrics_port,
                  "Serve GET /metrics (Prometheus text) on this port; 0 picks a free one "
                  "(default: off)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--metrics-host", metrics_host, "The address --metrics-port binds")
      ->capture_default_str();
  sub->add_option("--max-registrations", options.max_registrations,
                  "Prefill: the most decode sessions registered at once; new ones past it are "
                  "rejected (0: no bound)")
      ->capture_default_str();
  sub->add_option("--max-room-bytes", options.max_room_bytes,
                  "Fail rooms that would copy more (0: no cap)")
      ->capture_default_str();
  static std::string log_format = "text";
  sub->add_option("--log-format", log_format, kLogFormatHelp)
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  static double registry_ttl = 10;
  sub->add_option("--registry", options.registry,
                  "etcd://host:port: decode sidecars publish their data-plane descriptor there "
                  "(leased), prefill sidecars look descriptors up there before the handshake and "
                  "drop sessions whose entry expired (default: off, the handshake alone)");
  sub->add_option("--registry-ttl", registry_ttl,
                  "Seconds the registry keeps this sidecar's entries after it stops renewing them")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 3600.0));
  AddConfigFile(sub, std::cout);  // every flag above, and any added below, is a key
  sub->callback([&exit_code] {
    options.role = role == "prefill" ? sidecar::Role::kPrefill : sidecar::Role::kDecode;
    options.registry_ttl = absl::Seconds(registry_ttl);
    options.timeouts.bootstrap_timeout = absl::Seconds(bootstrap_timeout);
    options.timeouts.waiting_timeout = absl::Seconds(waiting_timeout);
    options.timeouts.unmatched_preallocation_timeout = absl::Seconds(preallocation_wait);
    options.timeouts.heartbeat_interval = absl::Seconds(heartbeat);
    options.timeouts.heartbeat_max_failures = heartbeat_failures;
    options.transfer_deadline = absl::Seconds(transfer_deadline);
    options.handshake_timeout = absl::Seconds(handshake_timeout);
    options.connect_timeout = absl::Seconds(connect_timeout);
    options.fence_timeout = absl::Seconds(fence_timeout);
    options.fence_wait = absl::Seconds(fence_wait);
    options.registration_ttl = absl::Seconds(registration_ttl);
    options.cachepd_revision = layout::RevisionFromName(cachepd_revision);
    options.sender_proofs = sender_proofs == "required" ? sidecar::SenderProofs::kRequired
                            : sender_proofs == "off"    ? sidecar::SenderProofs::kOff
                                                        : sidecar::SenderProofs::kAuto;
    options.row_staging = row_staging == "all" ? sidecar::SidecarOptions::RowStaging::kAll
                                               : sidecar::SidecarOptions::RowStaging::kAuto;
    if (!bootstrap_bearer_token_file.empty()) {
      absl::StatusOr<std::string> token =
          bootstrap::ReadBearerTokenFile(bootstrap_bearer_token_file);
      if (!token.ok()) {
        exit_code = Report(token.status(), "sidecar");
        return;
      }
      options.bootstrap_bearer_token = *std::move(token);
    }
    if (curve_key.empty() != curve_allowed.empty()) {
      exit_code = Report(absl::InvalidArgumentError(
                             "--curve-key and --curve-allowed go together: give both or neither"),
                         "sidecar");
      return;
    }
    if (!curve_key.empty()) {
      absl::StatusOr<zmq_auth::KeyFile> own = zmq_auth::ReadSecretKeyFile(curve_key);
      absl::StatusOr<zmq_auth::AllowedKeys> allowed =
          own.ok() ? zmq_auth::AllowedKeys::LoadDirectory(curve_allowed)
                   : absl::StatusOr<zmq_auth::AllowedKeys>(own.status());
      if (!allowed.ok()) {
        exit_code = Report(allowed.status(), "sidecar");
        return;
      }
      options.curve = std::make_shared<const zmq_auth::CurveKeys>(zmq_auth::CurveKeys{
          *std::move(own), std::make_shared<const zmq_auth::AllowedKeys>(*std::move(allowed))});
      // A peer can make the ZAP handlers refuse as often as it likes: one line per peer
      // address per 10 s, with the count held back.
      static PeerLogLimiter limiter(std::chrono::seconds(10));
      options.on_auth_refusal = [](const std::string& address, const std::string& reason) {
        const PeerLogLimiter::Verdict verdict =
            limiter.Admit(address, PeerLogLimiter::Clock::now());
        if (!verdict.log) return;
        spdlog::warn("event=curve_refused peer={} reason=\"{}\" held_back={}", address, reason,
                     verdict.held_back);
      };
    }
    BlockStopSignals();
    // Logs go to stderr: stdout carries the one "sidecar ready" line for whoever started us.
    spdlog::set_default_logger(spdlog::stderr_logger_mt("kvrail-sidecar"));
    if (log_format == "json") {
      spdlog::set_formatter(std::make_unique<JsonLogFormatter>(role, options.tp_rank));
    } else {
      spdlog::set_pattern(
          absl::StrCat("%Y-%m-%dT%H:%M:%S.%e %l ", role, "[", options.tp_rank, "] %v"));
    }
    absl::StatusOr<std::unique_ptr<sidecar::Sidecar>> sidecar = sidecar::Sidecar::Start(options);
    if (!sidecar.ok()) {
      exit_code = Report(sidecar.status(), "sidecar");
      return;
    }
    std::unique_ptr<metrics_http::MetricsServer> metrics;  // --metrics-port
    if (metrics_port >= 0) {
      absl::StatusOr<std::unique_ptr<metrics_http::MetricsServer>> started =
          metrics_http::MetricsServer::Start({metrics_host, metrics_port}, (*sidecar)->metrics());
      if (!started.ok()) {
        exit_code = Report(started.status(), "sidecar");
        return;
      }
      metrics = *std::move(started);
    }
    std::unique_ptr<registry::LeasePublisher> metrics_entry;  // --registry with --metrics-port
    if (metrics && !options.registry.empty()) {
      const std::string id = (*sidecar)->session_id().empty()
                                 ? (*sidecar)->cachepd_endpoint().substr(6)  // after tcp://
                                 : (*sidecar)->session_id();
      absl::StatusOr<std::unique_ptr<registry::LeasePublisher>> leased =
          registry::PublishMetricsEntry(options.registry, options.registry_ttl, role,
                                        options.tp_rank, id, metrics->address());
      if (!leased.ok()) {
        exit_code = Report(leased.status(), "sidecar");
        return;
      }
      metrics_entry = *std::move(leased);
    }
    // The fields are parsed by tools and tests: new ones go at the end.
    std::printf("sidecar ready engine=%s cachepd=%s session=%s%s\n",
                (*sidecar)->engine_endpoint().c_str(), (*sidecar)->cachepd_endpoint().c_str(),
                (*sidecar)->session_id().c_str(),
                metrics ? absl::StrCat(" metrics=", metrics->address()).c_str() : "");
    std::fflush(stdout);
    WaitForSignal();
    metrics_entry.reset();
    metrics.reset();
    (*sidecar)->Stop();
    exit_code = 0;
  });
}

void AddEngineSim(CLI::App& app, int& exit_code) {
  static sim::EngineSimOptions options;
  static std::string role;
  CLI::App* sub = app.add_subcommand(
      "engine-sim", "A simulated engine rank: owns a KV arena, drives its sidecar, checks bytes");
  sub->add_option("--role", role, "prefill or decode")
      ->required()
      ->check(CLI::IsMember({"prefill", "decode"}));
  sub->add_option("--sidecar", options.sidecar, "The sidecar's engine API endpoint")->required();
  sub->add_option("--arena-from", options.arena_from,
                  "Who allocates the KV arena: sidecar (on its data plane, mapped here) or "
                  "engine (this process, in shared memory named by --arena)")
      ->capture_default_str()
      ->check(CLI::IsMember({"engine", "sidecar"}));
  sub->add_option("--arena", options.arena,
                  "--arena-from engine: shared-memory name of the arena to create");
  sub->add_option("--bootstrap", options.bootstrap, "Decode: the prefill's bootstrap host:port");
  sub->add_option("--tp-size", options.tp_size)->capture_default_str();
  sub->add_option("--tp-rank", options.tp_rank)->capture_default_str();
  sub->add_option("--pages", options.shape.pages, "KV pages in the arena")->capture_default_str();
  sub->add_option("--decode-tokens", options.decode_tokens, "Tokens per room's toy decode")
      ->capture_default_str();
  sub->add_flag("--audit", options.audit,
                "The soak's checks: fill freed pages with a marker and check it when they are "
                "lent again (a late write says \"error late write\"); decode: say \"checked <id> "
                "<bytes>\" for each Success");
  AddShapeFlags(sub, options.shape);
  static std::string curve_key, curve_server_key;
  sub->add_option("--curve-key", curve_key,
                  "CURVE to a tcp engine API: this engine's .key (role engine, its sidecar's "
                  "rank). With --curve-server-key")
      ->check(CLI::ExistingFile);
  sub->add_option("--curve-server-key", curve_server_key, "CURVE: the sidecar's .pub")
      ->check(CLI::ExistingFile);
  sub->callback([&exit_code] {
    options.prefill = role == "prefill";
    if (curve_key.empty() != curve_server_key.empty()) {
      exit_code = Report(absl::InvalidArgumentError("--curve-key and --curve-server-key go "
                                                    "together: give both or neither"),
                         "engine-sim");
      return;
    }
    if (!curve_key.empty()) {
      absl::StatusOr<zmq_auth::KeyFile> own = zmq_auth::ReadSecretKeyFile(curve_key);
      absl::StatusOr<zmq_auth::KeyFile> server =
          own.ok() ? zmq_auth::ReadPublicKeyFile(curve_server_key) : own;
      if (!server.ok()) {
        exit_code = Report(server.status(), "engine-sim");
        return;
      }
      options.curve = zmq_auth::CurveClientKeys{*std::move(own), server->public_key};
    }
    exit_code = Report(sim::RunEngineSim(options), "engine-sim");
  });
}

void AddContract(CLI::App& app, int& exit_code) {
  static layout::KvShape shape;
  static int tp = 1;
  static bool arena_bytes = false;
  CLI::App* sub = app.add_subcommand(
      "contract",
      "Print the CachePD contract (CACHEPD §4, canonical wire) of a KV cache shape at one TP size");
  sub->add_option("--tp", tp, "Attention TP size: each rank holds kv-heads / tp heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--pages", shape.pages, "KV pages (blocks) in the arena")->capture_default_str();
  sub->add_flag("--arena-bytes", arena_bytes,
                "Print the bytes of the arena the contract describes instead (what AttachArena "
                "needs at least)");
  AddShapeFlags(sub, shape);
  sub->callback([&exit_code] {
    absl::StatusOr<std::string> wire = [&]() -> absl::StatusOr<std::string> {
      KVRAIL_ASSIGN_OR_RETURN(layout::Contract contract, layout::BuildKvContract(shape, tp));
      if (arena_bytes) return absl::StrCat(contract.ArenaBytes());
      return layout::SerializeContract(contract);
    }();
    if (!wire.ok()) {
      exit_code = Report(wire.status(), "contract");
      return;
    }
    std::printf("%s\n", wire->c_str());
  });
}

void AddDemo(CLI::App& app, int& exit_code) {
  static demo::DemoOptions options;
  options.shape.pages = 0;
  CLI::App* sub = app.add_subcommand(
      "demo", "A disaggregated serving loop on this machine: bootstrap, sidecars, engine-sims");
  sub->add_option("--prefill-tp", options.prefill_tp, "Prefill ranks P")->capture_default_str();
  sub->add_option("--decode-tp", options.decode_tp, "Decode ranks D")->capture_default_str();
  sub->add_option("--pp", options.prefill_pp, "Pipeline stages of the prefill node")
      ->capture_default_str();
  sub->add_option("--link", options.link,
                  "What carries the bytes between the ranks: shm or tcp (UCX shared memory, UCX "
                  "tcp on loopback), or verbs (the verbs backend: raw RDMA writes; see "
                  "--verbs-provider)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp", "verbs"}));
  AddRenamedFlag(sub, "--transport", "--link (shm, tcp or verbs)");
  sub->add_option("--verbs-provider", options.verbs_provider,
                  "With --link verbs: libibverbs (RDMA devices) or softverbs (the software "
                  "provider: shared memory on this host, never hardware); default "
                  "$KVRAIL_VERBS_PROVIDER, else libibverbs")
      ->check(CLI::IsMember({"libibverbs", "softverbs"}));
  sub->add_option("--arena", options.arena,
                  "Who allocates each rank's KV arena: sidecar (on its data plane, where peers "
                  "write fastest) or engine (the engine-sim, in POSIX shared memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sidecar", "engine"}));
  sub->add_option("--rooms", options.rooms, "Requests to route")->capture_default_str();
  sub->add_option("--concurrency", options.concurrency, "Rooms in flight")->capture_default_str();
  sub->add_option("--min-prompt", options.min_prompt, "Shortest prompt, tokens")
      ->capture_default_str();
  sub->add_option("--max-prompt", options.max_prompt, "Longest prompt, tokens")
      ->capture_default_str();
  sub->add_option("--seed", options.seed, "Prompt length draw")->capture_default_str();
  sub->add_option("--pages", options.shape.pages,
                  "KV pages per rank (default: enough for --concurrency longest prompts)");
  sub->add_flag("--json", options.json, "Print the summary as JSON");
  sub->add_option("--log-dir", options.log_dir,
                  "Where each process's log goes, one file per process (default: a new "
                  "directory under $TMPDIR or /tmp, named at the end)");
  sub->add_flag("--verify-digest", options.verify_digest,
                "Run every sidecar with --verify-digest (room digests checked before Success)");
  sub->add_flag("--emulate-gpu-arena", options.emulate_gpu_arena,
                "With --arena engine: every sidecar stages its arena through a host mirror, as "
                "a GPU arena over a transport without GPU access is (memcpy for cudaMemcpyAsync)");
  sub->add_option("--row-staging-bytes", options.row_staging_bytes,
                  "Every decode sidecar offers this much row staging memory: head-sliced rows "
                  "that land apart go back to back into a slot, which the decode scatters "
                  "(docs/PROTOCOL.md A.8; 0: none)")
      ->capture_default_str();
  sub->add_option("--row-staging", options.row_staging,
                  "With --row-staging-bytes: the routes staging serves, as every decode "
                  "sidecar's --row-staging: auto (rows that land apart, short, on a transport "
                  "that writes them one by one) or all (every route whose rows land apart)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "all"}));
  sub->add_flag("--metrics", options.metrics,
                "The bootstrap server and every sidecar serve GET /metrics (Prometheus) on a free "
                "port; print where, with a prometheus.yml scrape config");
  sub->add_option("--metrics-hold", options.metrics_hold_seconds,
                  "With --metrics: keep the cluster up this many seconds after the rooms, to "
                  "scrape it")
      ->check(CLI::Range(0, 86400));
  AddShapeFlags(sub, options.shape);
  sub->callback([&exit_code] {
    options.kvrail = SelfPath();
    exit_code = Report(demo::RunDemo(options), "demo");
  });
}

}  // namespace kvrail::tools
