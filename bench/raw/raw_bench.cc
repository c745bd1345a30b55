#include "bench/raw/raw_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bench/raw/cpu_usage.h"
#include "bench/raw/memcpy_limit.h"
#include "bench/raw/perftest.h"
#include "bench/raw/raw_target.h"
#include "bench/raw/write_window.h"
#include "cluster/netns.h"
#include "cluster/node_host.h"
#include "cluster/process/subprocess.h"
#include "engine/base/error.h"
#include "engine/memory/arena.h"
#include "engine/memory/pattern.h"
#include "engine/transfer/scheduler.h"
#include "engine/transport/bounds.h"
#include "engine/transport/factory.h"
#include "engine/transport/transport.h"
#include "engine/transport/ucx/ucx_transport.h"  // UcxTuningEnvironment, for ucx_perftest

namespace kvrail::bench {
namespace {

using process::SpawnOptions;
using process::Subprocess;

// Rows cycle through at most this much source and destination (more only repeats DRAM).
constexpr uint64_t kMaxWorkingSet = uint64_t{256} << 20;
// Verification writes come from odd source offsets, so a write that ignored its offsets
// fails; the check after the windows uses another shift than the one before them, so bytes
// left over from the first check (or from the windows) fail it too.
constexpr uint64_t kVerifyShiftBefore = 4096 + 64 + 3;
constexpr uint64_t kVerifyShiftAfter = 8192 + 512 + 7;
constexpr uint64_t kMaxVerifyShift = uint64_t{64} << 10;
// Each verification posts one batch of this many writes (or fewer, per the batch sizes).
constexpr int kVerifyBatch = 3;

// Prints "[ 3/24] tcp 64 KiB x32: ..." lines, or one updating bar on a terminal.
class Progress {
 public:
  Progress(std::FILE* out, int total)
      : out_(out), total_(total), tty_(out != nullptr && isatty(fileno(out))) {}
  ~Progress() {
    if (out_ != nullptr && tty_ && shown_) std::fputs("\r\033[K", out_);
  }
  void Step(const std::string& what) {
    if (out_ == nullptr) return;
    ++done_;
    if (tty_) {
      constexpr int kWidth = 24;
      const int filled = total_ > 0 ? std::min(kWidth, done_ * kWidth / total_) : 0;
      std::fprintf(out_, "\r\033[K[%s%s] %d/%d %s", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), done_, total_, what.c_str());
    } else {
      std::fprintf(out_, "[%d/%d] %s\n", done_, total_, what.c_str());
    }
    std::fflush(out_);
    shown_ = true;
  }
  void Note(const std::string& line) {
    if (out_ == nullptr) return;
    std::fprintf(out_, "%s%s\n", tty_ ? "\r\033[K" : "", line.c_str());
    std::fflush(out_);
  }

 private:
  std::FILE* out_;
  int total_;
  int done_ = 0;
  bool tty_;
  bool shown_ = false;
};

uint64_t WorkingSet(uint64_t block, int batch) {
  const uint64_t wanted = std::min<uint64_t>(block * static_cast<uint64_t>(batch), kMaxWorkingSet);
  return std::max(block, wanted / block * block);
}

// Where the two sides of one link run.
struct Placement {
  RawLink link;
  // This side (its UCX tcp device) and the target's (cluster/node_host.h: the argv prefix of
  // target-side processes, the ucx_perftest server's address, its UCX tcp device).
  cluster::NodeHost local, target;
  // verbs: the provider both sides use ("libibverbs", "softverbs"; transport::VerbsProviderOf).
  std::string verbs_provider;
};

// "tcp 64 KiB x32", "verbs(softverbs) 64 KiB x32".
std::string RowName(const Placement& where, uint64_t block, int batch) {
  const std::string name = where.verbs_provider.empty() ? std::string(RawLinkName(where.link))
                                                        : absl::StrCat(RawLinkName(where.link), "(",
                                                                       where.verbs_provider, ")");
  return absl::StrFormat("%s %s x%d", name, FormatBytes(block), batch);
}

RawTuning TuningFor(const RawBenchOptions& options, RawLink link) {
  RawTuning tuning = DefaultTuning(link);
  if (options.lanes > 0) tuning.lanes = options.lanes;
  if (options.slice_bytes > 0) tuning.slice_bytes = options.slice_bytes;
  if (options.inflight_bytes_per_lane > 0) {
    tuning.inflight_bytes_per_lane = options.inflight_bytes_per_lane;
  }
  if (options.transfers_per_lane > 0) tuning.transfers_per_lane = options.transfers_per_lane;
  tuning.slice_bytes = std::min(tuning.slice_bytes, kMaxBlockBytes);
  return tuning;
}

// ucx_perftest keeps as many puts outstanding as the row's batch, within the bytes in flight
// kvrail keeps per endpoint (and at least one).
int PeerOutstanding(uint64_t block, int batch, const RawTuning& tuning) {
  const uint64_t by_bytes = std::max<uint64_t>(1, tuning.inflight_bytes_per_lane / block);
  return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(batch), by_bytes));
}

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 13337;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 13337;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// True once process `pid` has a TCP socket listening on `port`, read from /proc/<pid>/net/tcp*
// (which shows the sockets of the namespace the process is in). The ucx_perftest server prints
// "Waiting for connection..." too, but stdio holds it back when stdout is a pipe.
bool WaitForListen(pid_t pid, int port, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string local = absl::StrFormat(":%04X", port);
  while (absl::Now() < deadline) {
    for (const char* file : {"tcp", "tcp6"}) {
      std::ifstream in(absl::StrCat("/proc/", pid, "/net/", file));
      std::string line;
      while (std::getline(in, line)) {
        // "  sl  local_address rem_address   st ...": st 0A is LISTEN.
        std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
        if (fields.size() > 3 && absl::EndsWith(fields[1], local) && fields[3] == "0A") {
          return true;
        }
      }
    }
    if (kill(pid, 0) != 0) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

struct PeerOutcome {
  std::optional<double> gbps;
  std::string note;
  std::optional<CpuShare> cpu;  // the machine's, from the client's start to its end
};

// The machine's CPU share since `before`, when both readings worked.
std::optional<CpuShare> CpuSince(const absl::StatusOr<CpuTimes>& before) {
  absl::StatusOr<CpuTimes> after = ReadCpuTimes();
  if (!before.ok() || !after.ok()) return std::nullopt;
  return ShareBetween(*before, *after);
}

// One ucx_perftest server + client run. Never fails: a missing figure comes with a note.
PeerOutcome RunPerftest(const RawBenchOptions& options, const Placement& where, uint64_t block,
                        int outstanding, double expected_bytes_per_s, bool tuned) {
  PerftestRun run;
  run.tls = where.link == RawLink::kShm ? "sm,self" : "tcp";
  if (where.link != RawLink::kShm) {
    run.net_devices = where.local.net_devices.empty() ? "lo" : where.local.net_devices;
    run.server_net_devices = where.target.net_devices;
  }
  run.server_host = where.target.host;
  run.block_bytes = block;
  run.outstanding = outstanding;
  if (tuned) {
    run.extra_env = transport::UcxTuningEnvironment(
        UcxOptionsFor(where.link, /*lanes=*/1, where.local.net_devices));
  }
  const double rate = std::max(expected_bytes_per_s, 20e6);
  run.iterations = static_cast<uint64_t>(
      std::clamp(options.seconds * rate / static_cast<double>(block), 4.0, 2e7));
  run.warmup = std::max<uint64_t>(2, run.iterations / 10);
  // The iterations aim at `seconds` at kvrail's rate; a peer much slower than that is stopped
  // at the limit and reports the average of the puts it completed (it prints one progress
  // line a second), so a collapse shows as a partial figure, not a hang.
  const double bytes = static_cast<double>((run.iterations + run.warmup) * block);
  const absl::Duration limit =
      absl::Seconds(std::clamp(bytes / 50e6, std::max(2.5, 4 * options.seconds), 30.0));

  std::string last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    run.port = FreeTcpPort();
    SpawnOptions server_spec = SpawnOptions::ContainedTool();
    server_spec.argv = where.target.prefix;
    server_spec.argv.push_back(options.perftest);
    for (std::string& arg : PerftestServerArgs(run)) server_spec.argv.push_back(std::move(arg));
    server_spec.env = PerftestServerEnv(run);
    server_spec.stderr_mode = SpawnOptions::Stderr::kToStdout;
    absl::StatusOr<std::unique_ptr<Subprocess>> server_started = Subprocess::Start(server_spec);
    if (!server_started.ok()) {
      return {std::nullopt, std::string{server_started.status().message()}, std::nullopt};
    }
    std::unique_ptr<Subprocess> server = *std::move(server_started);
    if (!WaitForListen(server->pid(), run.port, absl::Seconds(10))) {
      server->Stop(absl::Seconds(1));
      absl::StatusOr<std::string> said = server->ReadAll(absl::Seconds(1));
      last_error = absl::StrCat("ucx_perftest server did not listen on port ", run.port,
                                said.ok() ? absl::StrCat(": ", said->substr(0, 300)) : "");
      continue;
    }

    SpawnOptions client_spec = SpawnOptions::ContainedTool();
    client_spec.argv = {options.perftest};
    for (std::string& arg : PerftestClientArgs(run)) client_spec.argv.push_back(std::move(arg));
    client_spec.env = PerftestClientEnv(run);
    client_spec.stderr_mode = SpawnOptions::Stderr::kToStdout;
    const absl::StatusOr<CpuTimes> cpu_before = ReadCpuTimes();
    absl::StatusOr<std::unique_ptr<Subprocess>> client_started = Subprocess::Start(client_spec);
    if (!client_started.ok()) {
      return {std::nullopt, std::string{client_started.status().message()}, std::nullopt};
    }
    std::unique_ptr<Subprocess> client = *std::move(client_started);
    absl::StatusOr<std::string> output = client->ReadAll(limit);
    const std::optional<CpuShare> cpu = CpuSince(cpu_before);
    bool timed_out = false;
    if (!output.ok()) {
      timed_out = true;
      client->Stop(absl::Seconds(1));
      output = client->ReadAll(absl::Seconds(2));
    }
    absl::StatusOr<int> code = client->Wait(absl::Seconds(5));
    server->Stop(absl::Seconds(2));
    const std::string text = output.ok() ? *output : "";
    absl::StatusOr<PerftestResult> result = ParsePerftestOutput(text);
    if (result.ok() && (result->final || timed_out)) {
      PeerOutcome outcome{MibPerSecondToGbps(result->bandwidth_mib_per_s), "", cpu};
      if (!result->final) {
        outcome.note = absl::StrFormat(
            "ucx_perftest -s %u -O %d had not finished %u puts after %.1f s; its figure is the "
            "average of the %u it completed",
            block, outstanding, run.iterations, absl::ToDoubleSeconds(limit), result->iterations);
      }
      return outcome;
    }
    last_error = result.ok() ? "ucx_perftest stopped before its final result"
                             : std::string{result.status().message()};
    if (code.ok() && *code != 0) absl::StrAppend(&last_error, " (client exit ", *code, ")");
    if (timed_out) {
      last_error = absl::StrFormat("ucx_perftest printed no figure within %.1f s",
                                   absl::ToDoubleSeconds(limit));
      break;
    }
    // A client that could not reach a server not yet listening is retried.
    if (!absl::StrContains(text, "Connection refused")) break;
  }
  return {std::nullopt, last_error, std::nullopt};
}

// One connection of the bench: a transport with its own lanes, the source arena registered on
// it, its connection to the target, and the scheduler that drives its windows.
struct Connection {
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transfer::Scheduler> scheduler;  // declared after: destroyed before it
  WindowTarget target;
  int lanes = 0;
};

// The kvrail side of one link: the target process, this side's two connections (the tuned lanes,
// and one lane for the like-for-like comparison) and source arena, and the verification before
// and after the windows.
class KvrailSession {
 public:
  static absl::StatusOr<std::unique_ptr<KvrailSession>> Open(const RawBenchOptions& options,
                                                             const Placement& where,
                                                             const RawTuning& tuning) {
    std::unique_ptr<KvrailSession> session(new KvrailSession(options, where, tuning));
    absl::Status status = session->Start();
    if (!status.ok()) return status;
    return session;
  }

  // One row's window, after a short unmeasured warm-up (connection buffers, caches, the
  // progress threads' back-off).
  struct Measured {
    WindowResult window;
    std::optional<CpuShare> cpu;  // the machine's, during the measured window
  };
  // Which connection a window runs on.
  enum class Lanes { kTuned, kOne };
  // Writes cycle through `working_set` bytes (WorkingSet(block, batch) for the row itself).
  // Over one lane the scheduler keeps the bytes in flight ucx_perftest keeps: at most -O x block
  // posted and not yet complete, as ucx_perftest keeps at most -O puts. A sample of the measured
  // window's blocks is then checked at the target.
  absl::StatusOr<Measured> Measure(uint64_t block, int batch, uint64_t working_set, Lanes lanes) {
    Connection& connection = lanes == Lanes::kOne ? one_lane_ : tuned_;
    if (lanes == Lanes::kOne) {
      Schedule(connection, static_cast<uint64_t>(PeerOutstanding(block, batch, tuning_)) * block);
    }
    WindowSpec spec = Spec(block, batch, connection.lanes);
    spec.working_set = working_set;
    spec.destination_span = target_bytes_;
    spec.source_offset = NextShift();
    spec.duration = absl::Seconds(std::min(0.1, options_.seconds / 4));
    absl::StatusOr<WindowResult> warm =
        RunWriteWindow(*connection.scheduler, connection.target, spec);
    if (!warm.ok()) return warm.status();
    spec.source_offset = NextShift();  // not the warm-up's: the sample proves this window wrote
    spec.duration = absl::Seconds(options_.seconds);
    const absl::StatusOr<CpuTimes> cpu_before = ReadCpuTimes();
    absl::StatusOr<WindowResult> result =
        RunWriteWindow(*connection.scheduler, connection.target, spec);
    const std::string row =
        absl::StrCat(RowName(where_, block, batch), lanes == Lanes::kOne ? " (one lane)" : "");
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat(row, ": ", result.status().message()));
    }
    Measured measured{*result, CpuSince(cpu_before)};
    absl::Status sampled = VerifySample(spec, *result);
    if (!sampled.ok()) {
      return absl::DataLossError(absl::StrCat(
          row, ": the measured window's bytes at the target are wrong: ", sampled.message()));
    }
    return measured;
  }

  // Verifies again (the windows must not have broken anything), then stops both sides.
  absl::Status Close() {
    absl::Status verified = Verify(kVerifyShiftAfter);
    if (!verified.ok()) {
      return absl::DataLossError(
          absl::StrCat(RawLinkName(where_.link),
                       ": verification after the windows failed: ", verified.message()));
    }
    for (Connection* connection : {&one_lane_, &tuned_}) {
      connection->scheduler.reset();
      connection->transport->Close();
    }
    return target_->Stop();
  }

 private:
  KvrailSession(const RawBenchOptions& options, const Placement& where, const RawTuning& tuning)
      : options_(options), where_(where), tuning_(tuning) {}

  absl::Status Start() {
    uint64_t max_ws = 0;
    uint64_t sum_blocks = 0;
    for (uint64_t block : options_.block_sizes) {
      sum_blocks += block;
      for (int batch : options_.batch_sizes) max_ws = std::max(max_ws, WorkingSet(block, batch));
    }
    arena_bytes_ = std::max(max_ws, kVerifyBatch * sum_blocks) + kMaxVerifyShift;
    // The target's arena holds a copy of each row's working set per transfer in flight
    // (WindowSpec::destination_span), for the one-block rows too.
    target_bytes_ = arena_bytes_;
    for (uint64_t block : options_.block_sizes) {
      for (int batch : options_.batch_sizes) {
        for (uint64_t ws : {WorkingSet(block, batch), block}) {
          for (int lanes : {tuning_.lanes, 1}) {
            WindowSpec spec = Spec(block, batch, lanes);
            spec.working_set = ws;
            target_bytes_ = std::max(target_bytes_, static_cast<uint64_t>(TransfersInFlight(spec)) *
                                                        (ws / block) * block);
          }
        }
      }
    }

    RawTargetOptions target_options;
    target_options.link = where_.link;
    target_options.lanes = tuning_.lanes;
    target_options.arena_bytes = target_bytes_;
    target_options.net_device = where_.target.net_devices;
    target_options.verbs_provider = where_.verbs_provider;
    target_options.landing_stores = options_.landing_stores;
    absl::StatusOr<TargetProcess> target =
        TargetProcess::Start(where_.target.prefix, options_.self_exe, target_options);
    if (!target.ok()) return target.status();
    target_ = std::make_unique<TargetProcess>(std::move(*target));
    // The bounds the scheduler checks every transfer against: the target's descriptor, as a sidecar
    // has it from the handshake (control/sidecar/prefill_transfers.cc).
    absl::StatusOr<transport::RemoteRegions> regions =
        transport::RemoteRegions::FromDescriptor(target_->descriptor());
    if (!regions.ok()) return regions.status();
    remote_ = std::make_shared<const transport::RemoteRegions>(std::move(*regions));

    absl::StatusOr<Arena> arena = Arena::CreateMemfd("kvrail-bench-source", arena_bytes_);
    if (!arena.ok()) return arena.status();
    arena_ = std::make_unique<Arena>(std::move(*arena));
    FillPattern(absl::MakeSpan(arena_->data(), arena_->size()), kRawPatternSeed);
    KVRAIL_RETURN_IF_ERROR(Connect(tuning_.lanes, tuned_));
    KVRAIL_RETURN_IF_ERROR(Connect(1, one_lane_));
    absl::Status verified = Verify(kVerifyShiftBefore);
    if (!verified.ok()) {
      return absl::DataLossError(
          absl::StrCat(RawLinkName(where_.link), ": verification failed: ", verified.message()));
    }
    return absl::OkStatus();
  }

  // A transport of `lanes` lanes with the source arena registered, connected to the target, and
  // a scheduler on it with the bench's slice and in-flight bound.
  absl::Status Connect(int lanes, Connection& connection) {
    transport::TransportSpec spec =
        TransportSpecFor(where_.link, lanes, where_.local.net_devices, options_.landing_stores);
    spec.verbs_provider = where_.verbs_provider;
    spec.max_inflight_bytes_per_endpoint = tuning_.inflight_bytes_per_lane;
    KVRAIL_ASSIGN_OR_RETURN(connection.transport, transport::MakeTransport(spec));
    KVRAIL_ASSIGN_OR_RETURN(connection.target.source,
                            connection.transport->Register({arena_->data(), arena_->size()}));
    KVRAIL_ASSIGN_OR_RETURN(connection.target.peer,
                            connection.transport->Connect(target_->descriptor()));
    connection.target.source_length = arena_->size();
    connection.target.remote = remote_;
    connection.target.remote_base = target_->arena_address();
    connection.target.remote_length = target_->descriptor().regions(0).length();
    connection.lanes = lanes;
    Schedule(connection, tuning_.inflight_bytes_per_lane);
    return absl::OkStatus();
  }

  // Gives `connection` a scheduler with the bench's slice and `inflight` bytes in flight per lane,
  // unless it has one already.
  void Schedule(Connection& connection, uint64_t inflight) {
    if (connection.scheduler != nullptr &&
        connection.scheduler->max_inflight_bytes_per_endpoint() == inflight) {
      return;
    }
    connection.scheduler.reset();
    transfer::SchedulerOptions scheduler_options;
    scheduler_options.slice_bytes = tuning_.slice_bytes;
    scheduler_options.max_inflight_bytes_per_endpoint = inflight;
    connection.scheduler =
        std::make_unique<transfer::Scheduler>(connection.transport.get(), scheduler_options);
  }

  WindowSpec Spec(uint64_t block, int batch, int lanes) const {
    WindowSpec spec;
    spec.block_bytes = block;
    spec.batch = batch;
    spec.max_transfer_bytes = kMaxWorkingSet;
    spec.inflight_bytes = static_cast<uint64_t>(lanes) * tuning_.inflight_bytes_per_lane;
    spec.max_transfers = lanes * tuning_.transfers_per_lane;
    return spec;
  }

  // Page-aligned source shifts that differ from one window to the next, so a block at the
  // target that holds the pattern at a window's shift was written by that window.
  uint64_t NextShift() { return (windows_++ % (kMaxVerifyShift / 4096)) * 4096; }

  // The target checks the first block the window wrote, a middle one and the last.
  absl::Status VerifySample(const WindowSpec& spec, const WindowResult& result) {
    const uint64_t slots = std::max<uint64_t>(1, spec.working_set / spec.block_bytes);
    const uint64_t written = std::min(slots, result.blocks);
    if (written == 0) return absl::InternalError("the window landed no block");
    std::vector<uint64_t> sample = {0, written / 2, written - 1};
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    for (uint64_t slot : sample) {
      const uint64_t at = slot * spec.block_bytes;
      KVRAIL_RETURN_IF_ERROR(
          target_->Verify(spec.destination_offset + at, spec.block_bytes, spec.source_offset + at));
    }
    return absl::OkStatus();
  }

  // For every block size, one complete batch of up to kVerifyBatch writes to consecutive
  // destinations from source offset `shift`, flushed, and a check of every byte by the target:
  // the correctness check, through the same window and scheduler as the measurements.
  absl::Status Verify(uint64_t shift) {
    const int batch = std::min(
        kVerifyBatch, *std::max_element(options_.batch_sizes.begin(), options_.batch_sizes.end()));
    uint64_t cursor = 0;
    for (uint64_t block : options_.block_sizes) {
      const uint64_t bytes = block * static_cast<uint64_t>(batch);
      if (cursor + bytes > arena_bytes_ || shift + bytes > arena_bytes_) {
        return absl::InternalError("verification: the arenas are too small");
      }
      WindowSpec spec = Spec(block, batch, tuned_.lanes);
      spec.working_set = bytes;
      spec.source_offset = shift;
      spec.destination_offset = cursor;
      spec.duration = absl::Seconds(120);
      spec.max_bytes = bytes;
      absl::StatusOr<WindowResult> result = RunWriteWindow(*tuned_.scheduler, tuned_.target, spec);
      if (!result.ok()) return result.status();
      if (result->bytes != bytes) {
        return absl::InternalError(absl::StrFormat("a batch of %d writes of %u B landed %u B",
                                                   batch, block, result->bytes));
      }
      absl::Status status = target_->Verify(cursor, bytes, shift);
      if (!status.ok()) return status;
      cursor += bytes;
    }
    return absl::OkStatus();
  }

  const RawBenchOptions& options_;
  const Placement where_;
  const RawTuning tuning_;
  uint64_t arena_bytes_ = 0;   // the source's, and the least of the target's
  uint64_t target_bytes_ = 0;  // the target's
  uint64_t windows_ = 0;
  // Destroyed in reverse: the connections' transports go before the source arena they registered.
  std::unique_ptr<TargetProcess> target_;
  std::shared_ptr<const transport::RemoteRegions> remote_;
  std::unique_ptr<Arena> arena_;
  Connection tuned_;
  Connection one_lane_;
};

// One link measured from this process. Each row runs kvrail's window, then ucx_perftest
// and memcpy, one after the other, so that all three see the machine in the same state.
absl::StatusOr<std::vector<RawRow>> MeasureHere(const RawBenchOptions& options,
                                                const Placement& where, MemcpyLimit& memcpy_limit,
                                                Progress& progress) {
  const RawTuning tuning = TuningFor(options, where.link);
  absl::StatusOr<std::unique_ptr<KvrailSession>> session =
      KvrailSession::Open(options, where, tuning);
  if (!session.ok()) return session.status();

  std::vector<RawRow> rows;
  // (block, -O, tuned)
  std::map<std::tuple<uint64_t, int, bool>, PeerOutcome> peer_cache;
  auto peer = [&](uint64_t block, int outstanding, double expected, bool tuned) {
    const auto key = std::make_tuple(block, outstanding, tuned);
    auto it = peer_cache.find(key);
    if (it == peer_cache.end()) {
      PeerOutcome best;
      for (int run = 0; run < std::max(1, options.repeat); ++run) {
        PeerOutcome next = RunPerftest(options, where, block, outstanding, expected, tuned);
        if (!best.gbps.has_value() || (next.gbps.has_value() && *next.gbps > *best.gbps)) {
          best = std::move(next);
        }
      }
      it = peer_cache.emplace(key, std::move(best)).first;
    }
    return it->second;
  };
  using Lanes = KvrailSession::Lanes;
  // (piece, working set): the best of max(3, --repeat) memcpy runs.
  std::map<std::pair<uint64_t, uint64_t>, double> memcpy_cache;
  for (uint64_t block : options.block_sizes) {
    for (int batch : options.batch_sizes) {
      // Best of --repeat windows writing through `working_set` bytes.
      auto measure = [&](uint64_t working_set,
                         Lanes lanes) -> absl::StatusOr<KvrailSession::Measured> {
        std::optional<KvrailSession::Measured> best;
        for (int run = 0; run < std::max(1, options.repeat); ++run) {
          auto next = (*session)->Measure(block, batch, working_set, lanes);
          if (!next.ok()) return next.status();
          if (!best.has_value() || next->window.gbps() > best->window.gbps()) {
            best = std::move(*next);
          }
        }
        return *std::move(best);
      };
      absl::StatusOr<KvrailSession::Measured> best =
          measure(WorkingSet(block, batch), Lanes::kTuned);
      if (!best.ok()) return best.status();
      const WindowResult* window = &best->window;
      // A software provider's rate is no bandwidth: not even a progress line shows it.
      progress.Step(where.verbs_provider == "softverbs"
                        ? absl::StrFormat("%s: kvrail ran, bytes verified (software provider: "
                                          "no bandwidth figure)",
                                          RowName(where, block, batch))
                        : absl::StrFormat("%s: kvrail %.3f GB/s", RowName(where, block, batch),
                                          window->gbps()));
      RawRow row;
      row.link = RawLinkName(where.link);
      row.block_bytes = block;
      row.batch = batch;
      row.gbps = window->gbps();
      row.ops_per_s = window->blocks_per_s(block);
      row.lanes = tuning.lanes;
      row.inflight_bytes_per_lane = tuning.inflight_bytes_per_lane;
      row.working_set = WorkingSet(block, batch);
      // verbs has no ucx_perftest run, so no -O (the one-lane window keeps its bound).
      row.peer_outstanding =
          where.link == RawLink::kVerbs ? 0 : PeerOutstanding(block, batch, tuning);
      if (best->cpu.has_value()) {
        row.cpu_busy = best->cpu->busy;
        row.cpu_kernel = best->cpu->kernel;
      }
      // Like for like with ucx_perftest: one lane (one thread each side), the same bytes in
      // flight, and (tcp) the same segment sizes as the tuned ucx_perftest run below.
      absl::StatusOr<KvrailSession::Measured> one_lane =
          measure(WorkingSet(block, batch), Lanes::kOne);
      if (!one_lane.ok()) return one_lane.status();
      row.one_lane_gbps = one_lane->window.gbps();
      if (where.link == RawLink::kVerbs) {
        // ucx_perftest measures UCX, not the verbs backend; perftest's ib_write_bw (and a NIC)
        // would be the baseline, and bench raw does not run it.
        MarkVerbsRow(row, where.verbs_provider);
      } else if (options.run_peer) {
        const PeerOutcome outcome = peer(block, row.peer_outstanding, row.gbps * 1e9, false);
        row.peer_gbps = outcome.gbps;
        row.note = outcome.note;
        if (outcome.cpu.has_value()) {
          row.peer_cpu_busy = outcome.cpu->busy;
          row.peer_cpu_kernel = outcome.cpu->kernel;
        }
        // Over shared memory kvrail's settings change nothing UCX uses (they are tcp's).
        if (where.link != RawLink::kShm) {
          const PeerOutcome tuned = peer(block, row.peer_outstanding, row.gbps * 1e9, true);
          row.peer_tuned_gbps = tuned.gbps;
          if (row.note.empty() && !tuned.note.empty()) {
            row.note = absl::StrCat("tuned: ", tuned.note);
          }
        }
        if (!row.peer_gbps.has_value()) {
          progress.Note(absl::StrCat("warning: ", RowName(where, block, batch),
                                     ": no ucx_perftest figure: ", row.note));
        }
      } else {
        row.note = "ucx_perftest not run";
      }
      // Over shared memory a put is a copy, and ucx_perftest's one buffer stays in cache where
      // kvrail's batch of distinct pages does not: measure kvrail with perftest's working set
      // too, over one lane with perftest's bytes in flight, so that only the difference in what
      // each does per write is left in the comparison.
      if (where.link == RawLink::kShm && row.working_set > block) {
        absl::StatusOr<KvrailSession::Measured> one_block = measure(block, Lanes::kOne);
        if (!one_block.ok()) return one_block.status();
        row.one_block_gbps = one_block->window.gbps();
      }
      row.memcpy_threads = tuning.lanes;
      // The copies kvrail's lanes make: pieces of a block, sliced (over shared memory a 1 MiB
      // block is 32 pieces of 32 KiB, which glibc copies through the cache where it streams a
      // 1 MiB memcpy past it).
      const uint64_t piece = std::min(block, tuning.slice_bytes);
      auto copy_limit = memcpy_cache.find({piece, row.working_set});
      if (copy_limit == memcpy_cache.end()) {
        // At least 3 runs: one 0.2 s copy is easily caught in a neighbour's burst (a 256 MiB
        // working set measured 6.7 GB/s in one run of the bench and 12.5 in the next row).
        double best_copy = 0;
        for (int run = 0; run < std::max(3, options.repeat); ++run) {
          best_copy = std::max(
              best_copy, memcpy_limit.Gbps(piece, row.working_set, row.memcpy_threads,
                                           absl::Seconds(std::min(0.2, options.seconds / 2))));
        }
        copy_limit = memcpy_cache.emplace(std::make_pair(piece, row.working_set), best_copy).first;
      }
      row.memcpy_gbps = copy_limit->second;
      progress.Step(where.link == RawLink::kVerbs
                        ? absl::StrFormat("%s: no baseline (verbs), memcpy %.2f GB/s",
                                          RowName(where, block, batch), row.memcpy_gbps.value_or(0))
                        : absl::StrFormat("%s: ucx_perftest %s GB/s", RowName(where, block, batch),
                                          row.peer_gbps ? absl::StrFormat("%.3f", *row.peer_gbps)
                                                        : std::string("-")));
      rows.push_back(std::move(row));
    }
  }
  absl::Status closed = (*session)->Close();
  if (!closed.ok()) return closed;
  return rows;
}

// The netns rows: namespaces here, the measurement in a child inside the first of them.
absl::StatusOr<std::vector<RawRow>> MeasureNetns(const RawBenchOptions& options,
                                                 Progress& progress) {
  absl::StatusOr<cluster::NetnsPair> pair = cluster::NetnsPair::Create();
  if (!pair.ok()) return pair.status();
  std::vector<std::string> blocks, batches;
  for (uint64_t block : options.block_sizes) blocks.push_back(absl::StrCat(block));
  for (int batch : options.batch_sizes) batches.push_back(absl::StrCat(batch));
  SpawnOptions spec = SpawnOptions::ContainedTool();
  spec.argv = cluster::NetnsPair::ExecPrefix(pair->initiator().netns);
  spec.argv.insert(spec.argv.end(),
                   {options.self_exe, "bench", "raw", "--link", "netns", "--block-sizes",
                    absl::StrJoin(blocks, ","), "--batch-sizes", absl::StrJoin(batches, ","),
                    "--seconds", absl::StrCat(options.seconds), "--json", "--netns-side",
                    absl::StrJoin({pair->target().netns, pair->initiator().device,
                                   pair->target().device, pair->target().address},
                                  ",")});
  if (options.lanes > 0) {
    spec.argv.insert(spec.argv.end(), {"--lanes", absl::StrCat(options.lanes)});
  }
  if (options.inflight_bytes_per_lane > 0) {
    spec.argv.insert(spec.argv.end(),
                     {"--inflight", absl::StrCat(options.inflight_bytes_per_lane)});
  }
  if (options.slice_bytes > 0) {
    spec.argv.insert(spec.argv.end(), {"--slice", absl::StrCat(options.slice_bytes)});
  }
  if (options.transfers_per_lane > 0) {
    spec.argv.insert(spec.argv.end(), {"--transfers", absl::StrCat(options.transfers_per_lane)});
  }
  spec.argv.insert(spec.argv.end(), {"--repeat", absl::StrCat(options.repeat)});
  if (!options.run_peer) spec.argv.push_back("--no-peer");
  if (options.progress == nullptr) spec.argv.push_back("--quiet");
  // Its stdout is the rows' JSON; its stderr (progress, errors) is ours.
  progress.Note(absl::StrFormat("netns: %s (%s %s) <-> %s (%s %s)", pair->initiator().netns,
                                pair->initiator().device, pair->initiator().address,
                                pair->target().netns, pair->target().device,
                                pair->target().address));
  KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> child, Subprocess::Start(spec));
  const size_t rows = options.block_sizes.size() * options.batch_sizes.size();
  const absl::Duration limit =
      absl::Seconds(120 + static_cast<double>(rows) * (2 * options.seconds + 60));
  absl::StatusOr<std::string> output = child->ReadAll(limit);
  if (!output.ok()) {
    child->Stop();
    return absl::DeadlineExceededError(
        absl::StrCat("netns measurement did not finish within ", absl::FormatDuration(limit)));
  }
  absl::StatusOr<int> code = child->Wait(absl::Seconds(30));
  if (!code.ok()) return code.status();
  if (*code != 0) {
    return absl::InternalError(absl::StrCat("netns measurement inside ", pair->initiator().netns,
                                            " failed (exit ", *code, "; its error is above)"));
  }
  return RowsFromJson(*output);
}

}  // namespace

RawTuning DefaultTuning(RawLink link) {
  RawTuning tuning;
  switch (link) {
    case RawLink::kShm:
      // A put over shared memory is the posting core's memcpy: 32 KiB slices let both lanes'
      // cores copy even a 64 KiB write at once (with the bench's own window, before it drove the
      // scheduler: 64 KiB x 1 measured 1.17 to 1.57 of ucx_perftest with 32 KiB slices, 0.98 to
      // 1.01 with 256 KiB, where one core copies; 4 MiB slices left one core idle up to 4 MiB).
      tuning.lanes = 2;
      tuning.slice_bytes = uint64_t{32} << 10;
      tuning.inflight_bytes_per_lane = uint64_t{16} << 20;
      break;
    case RawLink::kTcp:
    case RawLink::kNetns:
      tuning.lanes = 2;
      tuning.slice_bytes = uint64_t{1} << 20;
      tuning.inflight_bytes_per_lane = uint64_t{4} << 20;
      break;
    case RawLink::kVerbs:
      // Not yet measured on a NIC: 1 MiB writes, and 16 MiB in flight per lane (a few
      // bandwidth-delay products of a 100-400 Gb/s NIC, well inside a QP's 256 work requests).
      tuning.lanes = 2;
      tuning.slice_bytes = uint64_t{1} << 20;
      tuning.inflight_bytes_per_lane = uint64_t{16} << 20;
      break;
  }
  return tuning;
}

absl::StatusOr<NetnsSide> ParseNetnsSide(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 4 ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("--netns-side: \"", text,
                     "\": expected target_netns,local_device,target_device,target_address"));
  }
  return NetnsSide{parts[0], parts[1], parts[2], parts[3]};
}

absl::StatusOr<std::vector<RawRow>> RunRawBench(const RawBenchOptions& options) {
  if (options.self_exe.empty()) {
    return absl::InvalidArgumentError("bench raw: the path of the kvrail binary is unknown");
  }
  if (!(options.seconds > 0) || options.seconds > 60) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--seconds: %g: a window lasts more than 0 and at most 60 seconds", options.seconds));
  }
  const size_t rows_per_link = options.block_sizes.size() * options.batch_sizes.size();
  int steps = 0;
  for (RawLink t : options.links) {
    if (t != RawLink::kNetns || options.netns_side.has_value()) {
      steps += static_cast<int>(2 * rows_per_link);
    }
  }
  Progress progress(options.progress, steps);
  uint64_t max_working_set = 0;
  for (uint64_t block : options.block_sizes) {
    for (int batch : options.batch_sizes) {
      max_working_set = std::max(max_working_set, WorkingSet(block, batch));
    }
  }
  MemcpyLimit memcpy_limit(max_working_set);
  std::vector<RawRow> rows;
  for (RawLink link : options.links) {
    absl::StatusOr<std::vector<RawRow>> measured;
    if (link == RawLink::kNetns && !options.netns_side.has_value()) {
      measured = MeasureNetns(options, progress);
    } else {
      Placement where;
      where.link = link;
      if (link == RawLink::kVerbs) {
        transport::TransportSpec spec;
        spec.backend = "verbs";
        absl::StatusOr<std::string> provider = transport::VerbsProviderOf(spec);
        if (!provider.ok()) return provider.status();
        where.verbs_provider = *provider;
        // Here first, where the error can say what to do, rather than in the target process.
        absl::StatusOr<std::unique_ptr<transport::Transport>> probe = transport::MakeTransport(
            TransportSpecFor(link, /*lanes=*/1, "", transport::LandingStores::kPlain));
        if (!probe.ok()) {
          return absl::Status(
              probe.status().code(),
              absl::StrCat("verbs (provider ", *provider, "): ", probe.status().message(),
                           *provider == "libibverbs"
                               ? "; without an RDMA NIC, KVRAIL_VERBS_PROVIDER=softverbs runs the "
                                 "verbs backend in software (a functional run, never a bandwidth "
                                 "figure)"
                               : ""));
        }
        (*probe)->Close();
        if (*provider == "softverbs") {
          progress.Note(
              absl::StrCat("verbs: provider softverbs (KVRAIL_VERBS_PROVIDER): ", kSoftverbsNote));
        }
      } else if (link == RawLink::kTcp) {
        where.local.net_devices = where.target.net_devices = "lo";
      } else if (link == RawLink::kNetns) {
        const NetnsSide& side = *options.netns_side;
        where.target.prefix = cluster::NetnsPair::ExecPrefix(side.target_netns);
        where.local.net_devices = side.local_device;
        where.target.net_devices = side.target_device;
        where.target.host = side.target_address;
      }
      measured = MeasureHere(options, where, memcpy_limit, progress);
    }
    if (!measured.ok()) return measured.status();
    rows.insert(rows.end(), measured->begin(), measured->end());
  }
  return rows;
}

}  // namespace kvrail::bench
